"""One PostgreSQL server shared by several parties, broker processes on it, CPU per party.

``bench.log_throughput`` and ``bench.timer_lag`` start one broker on its own embedded server;
``bench.fire_lag`` needs more: a peer job queue on the *same* server (its own database), three
brokers on one database, a broker restarted with other sweeper settings. So the server is
started here once (or an existing one is used), each party run gets a fresh database, and
brokers are launched against it with the broker-start machinery of ``bench.log_throughput``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.log_throughput import (
    BROKER_STOP_TIMEOUT_S,
    BrokerProcess,
    CpuMeter,
    _machine_busy_ticks,
    _proc_stats,
    error_lines,
    free_port,
    log_tail,
    wait_healthy,
)

REPO = Path(__file__).resolve().parent.parent


def with_dbname(url: str, dbname: str) -> str:
    params = conninfo_to_dict(url)
    params["dbname"] = dbname
    return make_conninfo(**params)


@dataclasses.dataclass
class Server:
    """A PostgreSQL server on which this run may create and drop databases."""

    admin_url: str
    description: str
    postmaster_pid: int | None  # None: not on this machine, its CPU is not accounted

    def create_database(self, prefix: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return with_dbname(self.admin_url, name)

    def drop_database(self, url: str) -> None:
        name = conninfo_to_dict(url)["dbname"]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                         .format(sql.Identifier(name)))

    @contextlib.contextmanager
    def database(self, prefix: str) -> Iterator[str]:
        url = self.create_database(prefix)
        try:
            yield url
        finally:
            with contextlib.suppress(psycopg.Error):
                self.drop_database(url)

    def settings(self) -> str:
        try:
            with psycopg.connect(self.admin_url, connect_timeout=5) as conn:
                values = [conn.execute(f"SHOW {n}").fetchone()[0]  # type: ignore[index]
                          for n in ("server_version", "fsync", "synchronous_commit")]
        except psycopg.Error as exc:
            return f"unknown ({type(exc).__name__})"
        return "PostgreSQL {} (fsync={}, synchronous_commit={})".format(*values)


def _local_postmaster(admin_url: str) -> int | None:
    """The server's postmaster pid if it runs on this machine: the parent of our backend."""
    try:
        with psycopg.connect(admin_url, connect_timeout=5) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            stat = Path(f"/proc/{backend}/stat").read_text()
    except (psycopg.Error, OSError):
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


@contextlib.contextmanager
def shared_server(admin_url: str | None) -> Iterator[Server]:
    """``admin_url``'s server, or a temporary embedded one with PostgreSQL's default (durable)
    settings, as a broker's own embedded server has."""
    if admin_url:
        yield Server(admin_url, "existing server (--admin-url / QUEEN_DATABASE_URL)",
                     _local_postmaster(admin_url))
        return
    from queen_trio.embedded import EmbeddedPostgres

    root = Path(tempfile.mkdtemp(prefix="queen-bench-pg-"))
    server = EmbeddedPostgres(root, database="postgres")
    try:
        server.start()
        yield Server(server.admin_url, "embedded (temporary), default settings", server.pid)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


# -- brokers ----------------------------------------------------------------------------------


@contextlib.contextmanager
def brokers(database_url: str, count: int = 1,
            env: Mapping[str, str] | None = None) -> Iterator[list[BrokerProcess]]:
    """``count`` broker subprocesses on one database, healthy, stopped (SIGTERM) on the way
    out. ``env`` adds or overrides QUEEN_* settings (inherited ones stay, so a QUEEN_SWEEPER_*
    set for the whole run applies)."""
    root = Path(tempfile.mkdtemp(prefix="queen-bench-brokers-"))
    procs: list[tuple[subprocess.Popen[bytes], BrokerProcess]] = []
    try:
        for i in range(count):
            port = free_port()
            log_path = root / f"broker-{i}.log"
            child_env = {**os.environ, **(env or {}), "QUEEN_DATABASE_URL": database_url,
                         "QUEEN_PORT": str(port), "QUEEN_HOST": "127.0.0.1",
                         "QUEEN_DATA_DIR": str(root / f"data-{i}"), "QUEEN_LOG_LEVEL": "INFO"}
            with open(log_path, "wb") as log_file:
                proc = subprocess.Popen([sys.executable, "-m", "queen_trio", "serve"],
                                        cwd=REPO, env=child_env, stdin=subprocess.DEVNULL,
                                        stdout=log_file, stderr=subprocess.STDOUT)
            procs.append((proc, BrokerProcess(f"http://127.0.0.1:{port}", "subprocess",
                                              database_url, log_path, proc.pid)))
        for proc, handle in procs:
            wait_healthy(handle.url, proc, handle.log_path)
        yield [handle for _, handle in procs]
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, handle in procs:
            try:
                proc.wait(timeout=BROKER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            handle.exit_code = proc.returncode
            handle.log_errors = error_lines(handle.log_path) if handle.log_path else []
            if handle.exit_code != 0:
                print(f"broker exited with {handle.exit_code}:\n{log_tail(handle.log_path)}",
                      file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)


# -- CPU per party ----------------------------------------------------------------------------


class PartyCpu:
    """CPU seconds of this client, the service processes under test (brokers, or the peer's
    worker; key "broker" so ``cpu_cell`` prints it), the shared PostgreSQL server (postmaster
    and every backend, exited ones included) and the rest of the machine."""

    TICK = CpuMeter.TICK

    def __init__(self, service_pids: list[int], postmaster_pid: int | None) -> None:
        self.service_pids = service_pids
        self.postmaster_pid = postmaster_pid

    def snapshot(self) -> dict[str, float]:
        snap = {"client": time.process_time()}
        if not Path("/proc").is_dir():
            return snap
        busy = _machine_busy_ticks()
        stats = _proc_stats()
        children: dict[int, list[int]] = {}
        for pid, (ppid, *_) in stats.items():
            children.setdefault(ppid, []).append(pid)

        def tree(pid: int) -> float:
            total, stack = 0.0, [pid]
            while stack:
                p = stack.pop()
                if p in stats:
                    total += stats[p][1] + stats[p][2]  # own + reaped (exited backends)
                stack.extend(children.get(p, []))
            return total / self.TICK

        snap["broker"] = sum(tree(p) for p in self.service_pids)
        snap["postgres"] = tree(self.postmaster_pid) if self.postmaster_pid else 0.0
        snap["other"] = busy / self.TICK - snap["client"] - snap["broker"] - snap["postgres"]
        return snap

    cores = staticmethod(CpuMeter.cores)
