"""The real command line, in subprocesses: the README's promises about `queen-trio serve`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest

from queen_trio.embedded import shared_buffers_mb

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "queen_trio"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    env.update(extra)
    return env


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"serve exited early with {proc.returncode}: {proc.stderr.read()}")
        try:
            r = httpx.get(url + "/health", timeout=1)
            if r.status_code == 200:
                return r
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"no healthy answer from {url} within {timeout} s")


def _postgres_processes_for(data_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "postgres" in (proc.info["name"] or "") and str(data_dir) in cmdline:
            found.append(proc)
    return found


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_serve_on_embedded_postgres_then_stop_signal(
    memory_path: Path, stop_signal: signal.Signals
) -> None:
    """SIGHUP (the terminal closing) stops the broker and its PostgreSQL like SIGTERM."""
    data_dir = memory_path / "queen-data"
    port = _free_port()
    proc = subprocess.Popen(
        CLI + ["serve"],
        env=_env(QUEEN_DATA_DIR=str(data_dir), QUEEN_PORT=str(port)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        r = _wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=15)
        assert r.json()["database"] == "up"
        postmaster = _postgres_processes_for(data_dir)
        assert postmaster, "the embedded server should be running"
        if stop_signal == signal.SIGTERM:
            # It runs with the WAL settings a burst of a million fires needs
            # (docs/timers-at-scale.md): no checkpoint forced in the middle of the drain.
            args = postmaster[0].cmdline()
            pg_port = args[args.index("-p") + 1]
            with psycopg.connect(f"postgresql://postgres@127.0.0.1:{pg_port}/queen") as conn:
                shown = {n: conn.execute(f"SHOW {n}").fetchone()[0]
                         for n in ("max_wal_size", "checkpoint_timeout")}
                # and shared buffers that hold what a burst of a million touches while it
                # drains (PostgreSQL's 128MB did not: the drain wrote pages out and read them
                # back), on a machine with the memory for them
                buffers_mb = conn.execute(
                    "SELECT setting::bigint * 8192 / 1048576 FROM pg_settings "
                    "WHERE name = 'shared_buffers'").fetchone()[0]
            assert shown == {"max_wal_size": "4GB", "checkpoint_timeout": "15min"}, shown
            assert buffers_mb == shared_buffers_mb(), buffers_mb
            if psutil.virtual_memory().total >= 8 * 2**30:
                assert buffers_mb == 1024, buffers_mb
        started = time.monotonic()
        proc.send_signal(stop_signal)
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - started < 5
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read()
    assert "using embedded PostgreSQL at postgresql://" in stderr
    assert "Traceback" not in stderr
    deadline = time.monotonic() + 5
    while _postgres_processes_for(data_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _postgres_processes_for(data_dir), "serve left its PostgreSQL running"
    assert (data_dir / "pg" / "PG_VERSION").exists(), "the data directory is kept for next time"


def test_serve_with_a_database_url_touches_no_embedded_server(
    tmp_path: Path, database_url: str
) -> None:
    data_dir = tmp_path / "never-created"
    port = _free_port()
    proc = subprocess.Popen(
        CLI + ["serve"],
        env=_env(QUEEN_DATABASE_URL=database_url, QUEEN_DATA_DIR=str(data_dir),
                 QUEEN_PORT=str(port)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=15)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not data_dir.exists()
    stderr = proc.stderr.read()
    assert "embedded" not in stderr
    # One line names the database (never its password), one the address; none from a logger
    # named "error" repeating it.
    url = psycopg.conninfo.conninfo_to_dict(database_url)
    assert f"database {url['dbname']} on {url['host']}:{url['port']} as {url['user']}" in stderr
    assert f"queen-trio listening on http://127.0.0.1:{port}" in stderr
    assert "Running on" not in stderr and "hypercorn.error" not in stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [("QUEEN_PORT", "http"), ("QUEEN_SWEEPER_MIN_SLEEP_MS", "-1"), ("QUEEN_AUTH", "maybe"),
     ("QUEEN_ALLOW_OPEN", "yes")],
)
def test_a_bad_setting_stops_start_up_with_one_line(variable: str, value: str) -> None:
    result = subprocess.run(
        CLI + ["serve"], env=_env(**{variable: value}), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert variable in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["migrate", "serve"])
@pytest.mark.parametrize("url", ["postgresql://postgres@127.0.0.1:1/queen",
                                 "postgresql://postgres@127.0.0.1:1,127.0.0.1:2/queen"])
def test_an_unreachable_database_is_one_line_and_exit_1(command: str, url: str) -> None:
    result = subprocess.run(CLI + [command], env=_env(QUEEN_DATABASE_URL=url),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the database" in lines[0], result.stderr
    assert "port 1 failed" in lines[0]
    assert ("port 2 failed" in lines[0]) == ("," in url)  # every host tried is named


@pytest.mark.parametrize("command", ["migrate", "serve", "tenants list"])
def test_a_database_that_never_answers_is_one_line_within_the_connect_timeout(
    command: str,
) -> None:
    """A host that accepts the connection and never says a word (a stalled server, a
    half-open firewall) costs QUEEN_DB_CONNECT_TIMEOUT_S, not libpq's 130 s."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)  # connects complete in the kernel; nothing is ever accepted or said
        url = f"postgresql://postgres@127.0.0.1:{hole.getsockname()[1]}/queen"
        started = time.monotonic()
        result = subprocess.run(
            CLI + command.split(),
            env=_env(QUEEN_DATABASE_URL=url, QUEEN_DB_CONNECT_TIMEOUT_S="2"),
            capture_output=True, text=True, timeout=60)
        took = time.monotonic() - started
    lines = result.stderr.strip().splitlines()
    if command.startswith("tenants"):
        assert result.returncode == 5, result.stderr
        lines = lines[1:]  # the first line says which database
    else:
        assert result.returncode == 1, result.stderr
    assert len(lines) == 1 and "cannot reach the database" in lines[0], result.stderr
    assert "QUEEN_DB_CONNECT_TIMEOUT_S" in lines[0], lines[0]
    assert took < 30, took  # 2 s and a Python start-up; wide for a loaded machine


def test_version_and_help() -> None:
    version = subprocess.run(CLI + ["version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("queen-trio ")
    flag = subprocess.run(CLI + ["--version"], capture_output=True, text=True, check=True)
    assert flag.stdout == version.stdout
    helptext = subprocess.run(CLI + ["--help"], capture_output=True, text=True, check=True).stdout
    for word in ("serve", "migrate", "version", "QUEEN_DATABASE_URL"):
        assert word in helptext
    bare = subprocess.run(CLI, capture_output=True, text=True)
    assert bare.returncode == 2


def test_a_repeated_sigterm_still_stops_postgres(memory_path: Path) -> None:
    """A supervisor that repeats itself (or an impatient Ctrl-C) must not orphan PostgreSQL."""
    data_dir = memory_path / "queen-data"
    port = _free_port()
    proc = subprocess.Popen(
        CLI + ["serve"],
        env=_env(QUEEN_DATA_DIR=str(data_dir), QUEEN_PORT=str(port)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=15)
        for _ in range(4):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.05)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 5
    while _postgres_processes_for(data_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _postgres_processes_for(data_dir), "a repeated SIGTERM orphaned PostgreSQL"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_busy_port_is_one_line_naming_the_address_and_exit_2(
    database_url: str, workers: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            CLI + ["serve"],
            env=_env(QUEEN_DATABASE_URL=database_url, QUEEN_PORT=str(port),
                     QUEEN_WORKERS=workers, QUEEN_LOG_LEVEL="WARNING"),
            capture_output=True, text=True, timeout=30,
        )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0]


@pytest.mark.parametrize("host", ["127.0.0.1", "no-such-host.invalid"])
def test_a_bad_address_stops_start_up_before_any_database_is_made(
    tmp_path: Path, host: str
) -> None:
    """Without QUEEN_DATABASE_URL: a busy port or an unknown QUEEN_HOST is one line and exit 2,
    and no embedded PostgreSQL was initialised for nothing."""
    data_dir = tmp_path / "never-created"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            CLI + ["serve"],
            env=_env(QUEEN_DATA_DIR=str(data_dir), QUEEN_HOST=host, QUEEN_PORT=str(port)),
            capture_output=True, text=True, timeout=30,
        )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot listen on {host}:{port}" in lines[0], result.stderr
    assert not data_dir.exists()


def _role_without_create(url: str) -> str:
    """A login role that may connect to the database at ``url`` but not create schemas in it
    (PostgreSQL grants CREATE on a database to its owner only)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS queen_no_create")
        conn.execute("CREATE ROLE queen_no_create LOGIN PASSWORD 's3cret'")
    return psycopg.conninfo.make_conninfo(url, user="queen_no_create", password="s3cret")


@pytest.mark.parametrize("command", ["migrate", "serve"])
def test_a_role_without_create_is_one_line_naming_what_is_missing(
    empty_database_url: str, command: str
) -> None:
    url = _role_without_create(empty_database_url)
    result = subprocess.run(CLI + [command], env=_env(QUEEN_DATABASE_URL=url,
                                                      QUEEN_PORT=str(_free_port())),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "CREATE" in lines[0] and "queen_no_create" in lines[0], lines[0]


def test_an_unusable_data_dir_is_one_line(tmp_path: Path) -> None:
    """Its parent a file (unwritable even by root); a read-only directory, when not root."""
    (tmp_path / "file").write_text("x")
    dirs = [tmp_path / "file" / "data"]
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        dirs.append(locked)
    for data_dir in dirs:
        result = subprocess.run(CLI + ["serve"], env=_env(QUEEN_DATA_DIR=str(data_dir),
                                                          QUEEN_PORT=str(_free_port())),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert f"cannot use the data directory {data_dir} (QUEEN_DATA_DIR)" in lines[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes the embedded server's user")
def test_run_as_root_the_system_user_is_said_once(memory_path: Path) -> None:
    port = _free_port()
    proc = subprocess.Popen(CLI + ["serve"], env=_env(QUEEN_DATA_DIR=str(memory_path / "d"),
                                                      QUEEN_PORT=str(port)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    said = [line for line in proc.stderr.read().splitlines() if "system user" in line]
    assert len(said) == 1 and "'embedded_postgres'" in said[0] and "root" in said[0], said


@pytest.mark.parametrize(("host", "extra", "refused"), [
    ("0.0.0.0", {}, True),
    ("::", {}, True),
    ("0.0.0.0", {"QUEEN_ALLOW_OPEN": "1"}, False),
    ("0.0.0.0", {"QUEEN_AUTH": "on"}, False),
    ("127.0.0.1", {}, False),
])
def test_an_open_address_with_auth_off_is_refused_unless_allowed(
    database_url: str, host: str, extra: dict[str, str], refused: bool
) -> None:
    port = _free_port()
    proc = subprocess.Popen(CLI + ["serve"], env=_env(QUEEN_DATABASE_URL=database_url,
                                                      QUEEN_HOST=host, QUEEN_PORT=str(port),
                                                      **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if refused:
            assert proc.wait(timeout=30) == 2
            lines = proc.stderr.read().strip().splitlines()
            assert len(lines) == 1, lines
            assert "QUEEN_AUTH off" in lines[0] and "QUEEN_ALLOW_OPEN=1" in lines[0]
        else:
            _wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=60)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_libpq_messages_are_logged_on_one_line(database_url: str) -> None:
    """The broker's connections killed under it: libpq's several-line messages ("terminating
    connection… server closed the connection unexpectedly / This probably means…") reach the
    log as one line per record."""
    port = _free_port()
    proc = subprocess.Popen(CLI + ["serve"], env=_env(QUEEN_DATABASE_URL=database_url,
                                                      QUEEN_PORT=str(port)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, timeout=60)
        dbname = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
        for _ in range(3):
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE datname = %s AND pid <> pg_backend_pid()", (dbname,))
            for _ in range(5):
                httpx.get(url + "/api/v1/resources/queues", timeout=10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = proc.stderr.read().splitlines()
    assert any("terminat" in line or "closed" in line for line in lines), lines
    assert [line for line in lines if not line[:2].isdigit()] == []
