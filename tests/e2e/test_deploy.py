"""deploy/: the container recipe and the systemd units, checked as far as this machine allows."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .test_serve import _env, _free_port, _wait_healthy

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def _unit(name: str) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit file as {section: [(key, value), …]} (comments and blank lines out)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for line in (DEPLOY / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        else:
            key, _, value = line.partition("=")
            current.append((key.strip(), value.strip()))
    return sections


def _containerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined."""
    text = (DEPLOY / "Containerfile").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def test_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    # verify checks that ExecStart= exists: point it at this machine's queen-trio.
    exe = shutil.which("queen-trio") or sys.executable
    service = (DEPLOY / "queen-trio.service").read_text()
    assert "ExecStart=/opt/queen-trio/bin/queen-trio serve" in service
    (tmp_path / "queen-trio.service").write_text(
        service.replace("/opt/queen-trio/bin/queen-trio", exe))
    shutil.copy(DEPLOY / "queen-trio.socket", tmp_path)
    done = subprocess.run([analyze, "verify", "queen-trio.socket", "queen-trio.service"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    # verify exits 0 on unknown keys and bad values too; it only complains. Ours must not.
    complaints = [ln for ln in (done.stdout + done.stderr).splitlines() if "queen-trio." in ln]
    assert done.returncode == 0 and not complaints, done.stdout + done.stderr


def test_the_socket_and_the_service_agree() -> None:
    socket_unit, service = _unit("queen-trio.socket"), _unit("queen-trio.service")
    assert ("ListenStream", "127.0.0.1:6632") in socket_unit["Socket"]
    assert ("Requires", "queen-trio.socket") in service["Unit"]
    # systemd passes the first socket as fd 3 (SD_LISTEN_FDS_START).
    assert ("Environment", "QUEEN_LISTEN_FD=3") in service["Service"]
    assert ("KillSignal", "SIGTERM") in service["Service"]


@pytest.mark.slow
def test_the_service_has_descriptors_for_a_crowd_of_connections() -> None:
    """Each connection (a parked long-poll too) holds a descriptor: systemd's usual 1,024 let
    1,009 idle connections lock every client out."""
    limits = [value for key, value in _unit("queen-trio.service")["Service"]
              if key == "LimitNOFILE"]
    assert limits and int(limits[-1].split(":")[0]) >= 65536, limits


def test_serve_on_a_socket_passed_as_systemd_does(database_url: str, tmp_path: Path) -> None:
    """What socket activation does, without systemd: bind, hand the socket over as fd 3 with
    the unit's Environment= lines, and the broker answers on it; SIGTERM stops it with 0."""
    unit_env = dict(value.split("=", 1) for key, value in _unit("queen-trio.service")["Service"]
                    if key == "Environment")
    unit_env["QUEEN_DATA_DIR"] = str(tmp_path)  # not /var/lib/queen-trio
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    fd = listener.fileno()
    proc = subprocess.Popen(
        [sys.executable, "-m", "queen_trio", "serve"],
        env=_env(**unit_env, QUEEN_DATABASE_URL=database_url),
        preexec_fn=lambda: os.dup2(fd, 3), close_fds=False,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    listener.close()  # the broker holds it now, as it would from systemd
    try:
        r = _wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=15)
        assert r.json()["database"] == "up"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in proc.stderr.read()


def test_compose_runs_the_broker_against_postgres_16() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    postgres, broker = services["postgres"], services["broker"]
    assert postgres["image"].endswith("postgres:16")
    env = postgres["environment"]
    url = broker["environment"]["QUEEN_DATABASE_URL"]
    assert url == (f"postgresql://{env['POSTGRES_USER']}:{env['POSTGRES_PASSWORD']}"
                   f"@postgres:5432/{env['POSTGRES_DB']}")
    assert broker["environment"]["QUEEN_HOST"] == "0.0.0.0"
    assert broker["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert "http://127.0.0.1:6632/health" in " ".join(broker["healthcheck"]["test"])
    assert broker["ports"] == ["127.0.0.1:6632:6632"]
    build = broker["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (
        DEPLOY / "Containerfile").resolve()
    assert set(compose["volumes"]) == {"pgdata"}
    # A compose tool, if this machine has one, must accept the file as well.
    for tool in (["docker-compose"], ["podman-compose"]):
        if shutil.which(tool[0]):
            done = subprocess.run(tool + ["-f", str(DEPLOY / "compose.yaml"), "config", "-q"],
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr


def test_containerfile_installs_without_dev_extra_and_checks_health() -> None:
    instructions = _containerfile()
    kinds = [kind for kind, _ in instructions]
    assert kinds[0] == "FROM" and "python:3.11" in instructions[0][1]
    for kind, args in instructions:
        if kind == "COPY":  # every path it copies exists in the build context (the repo)
            for source in args.split()[:-1]:
                assert (REPO / source).exists(), source
        if kind == "RUN" and "pip install" in args:
            assert "pip install --no-cache-dir ." in args and "[dev]" not in args
    assert ("EXPOSE", "6632") in instructions
    assert ("USER", "queen") in instructions
    health = dict(instructions)["HEALTHCHECK"]
    assert "http://127.0.0.1:6632/health" in health
    assert dict(instructions)["CMD"] == '["queen-trio", "serve"]'


def test_containerfile_keeps_the_embedded_data_in_a_volume() -> None:
    """Without QUEEN_DATABASE_URL the broker keeps its PostgreSQL under QUEEN_DATA_DIR: a volume,
    so that recreating the container (a new image, `compose up` after a change) keeps it."""
    instructions = _containerfile()
    env = dict(item.split("=", 1) for item in dict(instructions)["ENV"].split())
    volumes = [args for kind, args in instructions if kind == "VOLUME"]
    assert volumes and env["QUEEN_DATA_DIR"] in volumes[0]


@pytest.mark.parametrize("source", ["Containerfile", "compose.yaml"])
def test_the_images_open_address_is_a_stated_choice(database_url: str, source: str) -> None:
    """The image binds 0.0.0.0 with auth off: the broker refuses that (one line, exit 2)
    unless QUEEN_ALLOW_OPEN=1 says it is meant, as compose.yaml does (publishing the port on
    the host's loopback only)."""
    image = dict(item.split("=", 1) for item in dict(_containerfile())["ENV"].split())
    assert (image["QUEEN_HOST"], image["QUEEN_AUTH"], image["QUEEN_ALLOW_OPEN"]) == (
        "0.0.0.0", "off", "0")
    env = dict(image)
    if source == "compose.yaml":
        broker = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["broker"]
        assert broker["ports"] == ["127.0.0.1:6632:6632"]
        env.update(broker["environment"])
        assert env["QUEEN_ALLOW_OPEN"] == "1"
    port = _free_port()
    env.update(QUEEN_DATABASE_URL=database_url, QUEEN_PORT=str(port), QUEEN_ALLOWED_HOSTS="")
    proc = subprocess.Popen([sys.executable, "-m", "queen_trio", "serve"], env=_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if source == "Containerfile":
            assert proc.wait(timeout=30) == 2
            lines = proc.stderr.read().strip().splitlines()
            assert len(lines) == 1 and "QUEEN_ALLOW_OPEN=1" in lines[0], lines
        else:
            _wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=60)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
