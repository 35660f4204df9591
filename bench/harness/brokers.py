"""Broker processes (``python -m queen_trio serve``): one on its own embedded PostgreSQL
(``broker_process``) or several on one database of a shared server (``brokers``), started on
free ports, waited for until healthy, stopped with SIGTERM (then killed) on the way out, with
their log's tail and first errors kept for the report."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent.parent
BROKER_START_TIMEOUT_S = 60.0
BROKER_STOP_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards ``wanted`` (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, max(soft, wanted)) if hard != resource.RLIM_INFINITY else max(soft, wanted)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def wait_healthy(url: str, process: subprocess.Popen[bytes] | None, log_path: Path | None,
                 *, timeout_s: float = BROKER_START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"broker exited with {process.returncode}:\n{log_tail(log_path)}")
        try:
            response = httpx.get(f"{url}/health", timeout=2.0)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise RuntimeError(f"broker not healthy after {timeout_s} s ({last}):\n"
                       f"{log_tail(log_path)}")


def log_tail(path: Path | None, lines: int = 30) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def error_lines(path: Path, limit: int = 60) -> list[str]:
    """The broker log from its first ERROR or traceback on (at most ``limit`` lines)."""
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    for i, line in enumerate(lines):
        if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback"):
            return lines[i:i + limit]
    return []


@dataclasses.dataclass
class BrokerProcess:
    url: str
    source: str
    database_url: str | None
    log_path: Path | None
    pid: int | None = None
    exit_code: int | None = None
    log_errors: list[str] = dataclasses.field(default_factory=list)


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = BROKER_STOP_TIMEOUT_S) -> None:
    """SIGTERM, then SIGKILL if ``proc`` has not exited within ``timeout_s``; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def serve_checkout(checkout: Path, database_url: str, port: int) -> subprocess.Popen[bytes]:
    """A broker of another checkout (its code on PYTHONPATH) on ``port``, quiet: an A/B run
    serves this checkout and a baseline side by side on one database server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    env.update(QUEEN_DATABASE_URL=database_url, QUEEN_PORT=str(port), QUEEN_LOG_LEVEL="WARNING",
               PYTHONPATH=str(checkout))
    return subprocess.Popen([sys.executable, "-m", "queen_trio", "serve"], cwd=checkout,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def broker_process(url: str | None, *, start_timeout_s: float = BROKER_START_TIMEOUT_S,
                   checkout: Path | None = None) -> Iterator[BrokerProcess]:
    """The broker at ``url``, or one started here and stopped (SIGTERM) on the way out; with
    ``checkout``, that checkout's code (an A/B run against a baseline)."""
    if url:
        wait_healthy(url, None, None)
        yield BrokerProcess(url, f"existing broker at {url}",
                            os.environ.get("QUEEN_DATABASE_URL") or None, None)
        return
    data_dir = Path(tempfile.mkdtemp(prefix="queen-bench-log-"))
    log_path = data_dir / "broker.log"
    port = free_port()
    env = {**os.environ, "QUEEN_PORT": str(port), "QUEEN_HOST": "127.0.0.1",
           "QUEEN_DATA_DIR": str(data_dir / "data"), "QUEEN_LOG_LEVEL": "INFO"}
    external_db = env.get("QUEEN_DATABASE_URL") or None
    source = "QUEEN_DATABASE_URL" if external_db else "embedded (temporary)"
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen([sys.executable, "-m", "queen_trio", "serve"], env=env,
                                   cwd=checkout, stdout=log_file, stderr=subprocess.STDOUT)
    handle = BrokerProcess(f"http://127.0.0.1:{port}", f"subprocess, database {source}",
                           external_db, log_path, process.pid)
    try:
        wait_healthy(handle.url, process, log_path, timeout_s=start_timeout_s)
        if handle.database_url is None:
            match = re.search(r"using embedded PostgreSQL at (\S+)", log_path.read_text())
            handle.database_url = match.group(1) if match else None
        yield handle
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=BROKER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"broker did not stop in {BROKER_STOP_TIMEOUT_S} s; killing it",
                      file=sys.stderr)
                process.kill()
                process.wait()
        handle.exit_code = process.returncode
        handle.log_errors = error_lines(log_path)
        if handle.exit_code != 0:
            print(f"broker exited with {handle.exit_code}:\n{log_tail(log_path)}", file=sys.stderr)
        shutil.rmtree(data_dir, ignore_errors=True)


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

@contextlib.contextmanager
def side_broker(checkout: Path, database_url: str) -> Iterator[tuple[str, int]]:
    """A broker of ``checkout`` on ``database_url``: (url, pid)."""
    root = Path(tempfile.mkdtemp(prefix="queen-bench-sched-"))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(checkout), "QUEEN_DATABASE_URL": database_url,
           "QUEEN_PORT": str(port), "QUEEN_HOST": "127.0.0.1",
           "QUEEN_DATA_DIR": str(root / "data"), "QUEEN_LOG_LEVEL": "WARNING"}
    log_path = root / "broker.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "queen_trio", "serve"], cwd=checkout,
                                env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log_path)
        yield url, proc.pid
    finally:
        stop_process(proc)

