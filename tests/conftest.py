"""Fixtures shared by every test: the PostgreSQL server, per-test databases, a running broker."""

from __future__ import annotations

import dataclasses
import shutil
import ssl
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio

from queen_trio.config import Settings
from queen_trio.server import BrokerHandle, run_broker

from .pgserver import Databases, memory_root, session_server

_server_description = "not started"


def _share_the_default_ssl_context() -> None:
    """Every httpx client builds an SSL context from certifi's bundle, even for http:// (40 ms
    of CPU; 0.3 s of wall time on a loaded 2-core machine), and the suite makes thousands of
    clients. They share one here: a context holds no per-connection state. Only the default
    (``verify=True``, no client certificate) is shared; anything else is built as asked."""
    from httpx._transports import default as transports

    build = transports.create_ssl_context
    shared: dict[bool, ssl.SSLContext] = {}

    def create_ssl_context(verify: Any = True, cert: Any = None,
                           trust_env: bool = True) -> ssl.SSLContext:
        if verify is not True or cert is not None:
            return build(verify=verify, cert=cert, trust_env=trust_env)
        if trust_env not in shared:
            shared[trust_env] = build(verify=True, cert=None, trust_env=trust_env)
        return shared[trust_env]

    transports.create_ssl_context = create_ssl_context


_share_the_default_ssl_context()


@pytest.fixture(scope="session")
def databases() -> Iterator[Databases]:
    global _server_description
    with session_server() as (admin_url, description):
        with psycopg.connect(admin_url) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
        _server_description = f"{description}, PostgreSQL {version}"
        databases = Databases(admin_url, ahead=True)
        try:
            yield databases
        finally:
            databases.close()


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if _worker_servers:  # pytest-xdist: each worker had its own
        for worker, description in sorted(_worker_servers.items()):
            terminalreporter.write_line(f"database server ({worker}): {description}")
    else:
        terminalreporter.write_line(f"database server: {_server_description}")


# pytest-xdist (pyproject's addopts: -n auto). The suite's processes use about half a core
# while it runs serially (it mostly waits: leases, timeouts, subprocesses), so two workers share
# the 2-core box; each runs its own session, with its own PostgreSQL server (pgserver.py).
_worker_servers: dict[str, str] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: ``QUEEN_TEST_WORKERS`` if set; else two for the whole suite, and none (one
    process, no start-up of workers) when the command names the tests to run."""
    import os

    if os.environ.get("QUEEN_TEST_WORKERS"):
        return int(os.environ["QUEEN_TEST_WORKERS"])
    return 0 if config.args_source == pytest.Config.ArgsSource.ARGS else 2


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller prints it
        workeroutput["queen_server"] = _server_description


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    worker = getattr(getattr(node, "gateway", None), "id", "worker")
    _worker_servers[worker] = getattr(node, "workeroutput", {}).get("queen_server", "?")


@pytest.fixture
def memory_path() -> Iterator[Path]:
    """A fresh directory for a PostgreSQL data directory (initdb, pg_basebackup): in memory
    where the machine allows (see ``memory_root``), removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="t-", dir=memory_root()))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def database_url(databases: Databases) -> Iterator[str]:
    """A fresh database with every migration applied, dropped after the test."""
    url = databases.create()
    yield url
    databases.drop(url)


@pytest.fixture
def empty_database_url(databases: Databases) -> Iterator[str]:
    """A fresh database on which no migration has run."""
    url = databases.create(migrated=False)
    yield url
    databases.drop(url)


@pytest.fixture
def settings(database_url: str) -> Settings:
    """Broker settings for in-process tests: the test database and an ephemeral port."""
    return Settings(database_url=database_url, port=0, graceful_timeout_ms=1000, db_pool_size=5)


@pytest.fixture
async def broker(settings: Settings) -> AsyncIterator[BrokerHandle]:
    """A broker running in the test's trio run, serving HTTP on 127.0.0.1:<random>."""
    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(run_broker, settings)
        yield handle
        handle.shutdown()


@pytest.fixture
async def http(broker: BrokerHandle) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=broker.url, timeout=10) as client:
        yield client


def replace_settings(settings: Settings, **changes: Any) -> Settings:
    return dataclasses.replace(settings, **changes)
