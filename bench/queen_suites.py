"""Queen's own client test suites against this checkout's broker.

The suites live outside the repo (Queen's test files are not ours to copy in); the directory
they were assembled in (default ``/work/queen-suites``, its README says where each file came
from) holds three of them:

- ``py26``: queen-mq 2.6.0's integration tests (from its sdist), in a venv with queen-mq 2.6.0;
- ``py015``: the Python client's tests at Queen 0.15.0, with that client in its own venv;
- ``js015``: the JavaScript client's test-v2 at Queen 0.15.0 (node), our ``run.js`` driver.

Each suite gets its own broker (``python -m queen_trio serve`` from this checkout) on a fresh
embedded PostgreSQL, so nothing one suite leaves behind is seen by the next (Queen's own
conftests purge Queen's tables instead), and with a throwaway ``QUEEN_ENCRYPTION_KEY`` (unless
one is set) for the suites' encrypted queues. The result, per test PASS / FAIL / SKIP and for each
failure its first error line, goes to ``bench/results/queen_suites.txt`` (and ``.json``, from
which the next run lists what changed).

    python -m bench.queen_suites [--suites DIR] [--only py26,js015] [-k EXPR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.harness.brokers import REPO, broker_process
from bench.harness.report import load, now_iso, save_json, source_revision

RESULTS = REPO / "bench" / "results"
DEFAULT_SUITES = Path("/work/queen-suites")
SUITE_TIMEOUT_S = 45 * 60
# A fresh embedded PostgreSQL on a loaded 2-core machine can take more than the usual minute.
START_TIMEOUT_S = 300.0


@dataclasses.dataclass
class Suite:
    key: str
    title: str
    # pytest suites: the venv's pytest in the suite directory; the JS one: node test-v2/run.js
    kind: str


SUITES = [
    Suite("py26", "queen-mq 2.6.0 (its sdist's tests)", "pytest"),
    Suite("py015", "Python client, Queen 0.15.0", "pytest"),
    Suite("js015", "JavaScript client test-v2, Queen 0.15.0", "node"),
]


@dataclasses.dataclass
class Outcome:
    name: str
    status: str  # PASS, FAIL, SKIP
    detail: str = ""  # the first error line, or the skip reason


def first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def broker_env(url: str, database_url: str | None) -> dict[str, str]:
    """What the suites read: the broker's URL under each name they use, and the database
    (Queen's JS auth/watermark tests and its 0.15.0 conftest connect to it themselves)."""
    env = {**os.environ, "QUEEN_SERVER_URL": url, "QUEEN_URL": url}
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(key, None)
    if database_url:
        parts = urlsplit(database_url)
        env.update(PG_HOST=parts.hostname or "localhost", PG_PORT=str(parts.port or 5432),
                   PG_DB=parts.path.lstrip("/") or "postgres", PG_USER=parts.username or "postgres",
                   PG_PASSWORD=parts.password or "")
    return env


def pytest_outcomes(junit: Path) -> list[Outcome]:
    outcomes = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        name = f"{module}.py::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            outcomes.append(Outcome(name, "FAIL", first_line(problem.get("message"))
                                    or first_line(problem.text)))
        elif skipped is not None:
            outcomes.append(Outcome(name, "SKIP", first_line(skipped.get("message"))))
        else:
            outcomes.append(Outcome(name, "PASS"))
    return outcomes


def js_outcomes(output: str) -> list[Outcome]:
    match = re.search(r"^QUEEN_SUITE_RESULTS (.*)$", output, re.M)
    if not match:
        return []
    return [Outcome(f"{r['module']}.{r['name']}", "PASS" if r["success"] else "FAIL",
                    "" if r["success"] else first_line(r["message"]))
            for r in json.loads(match.group(1))]


def run_suite(suite: Suite, root: Path, selection: str | None, log_dir: Path) -> dict[str, Any]:
    directory = root / suite.key
    log_path = log_dir / f"{suite.key}.log"
    started = time.monotonic()
    with broker_process(None, start_timeout_s=START_TIMEOUT_S) as broker:
        env = broker_env(broker.url, broker.database_url)
        junit = log_dir / f"{suite.key}.xml"
        if suite.kind == "pytest":
            cmd = [str(directory / "venv" / "bin" / "python"), "-m", "pytest", "-q", "-rN",
                   f"--junitxml={junit}"] + (["-k", selection] if selection else [])
        else:
            cmd = ["node", "test-v2/run.js"] + (selection.split(",") if selection else [])
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.run(cmd, cwd=directory, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, timeout=SUITE_TIMEOUT_S)
                code: int | str = proc.returncode
            except subprocess.TimeoutExpired:
                code = f"timed out after {SUITE_TIMEOUT_S} s"
        broker_log = broker.log_path.read_text(errors="replace") if broker.log_path else ""
    # Stopped before the runner stopped it (killed from outside, or crashed): what failed after
    # that says nothing about the broker's behaviour.
    died = next((line for line in broker_log.splitlines()
                 if "received SIG" in line or "queen-trio stopped" in line), "")
    (log_dir / f"{suite.key}.broker.log").write_text(broker_log)
    output = log_path.read_text(errors="replace")
    if suite.kind == "pytest":
        outcomes = pytest_outcomes(junit) if junit.exists() else []
    else:
        outcomes = js_outcomes(output)
    counts = {s: sum(1 for o in outcomes if o.status == s) for s in ("PASS", "FAIL", "SKIP")}
    return {"key": suite.key, "title": suite.title, "exit": code, "counts": counts,
            "seconds": round(time.monotonic() - started, 1), "log": str(log_path),
            "broker_errors": broker.log_errors[:5], "broker_stopped_early": died,
            "tests": [dataclasses.asdict(o) for o in outcomes]}


def changes(previous: dict[str, Any] | None, suite: dict[str, Any]) -> list[str]:
    if not previous:
        return []
    before = {t["name"]: t["status"] for s in previous.get("suites", []) if s["key"] == suite["key"]
              for t in s["tests"]}
    if not before:
        return []
    return [f"  {t['name']}: {before[t['name']]} -> {t['status']}" for t in suite["tests"]
            if t["name"] in before and before[t["name"]] != t["status"]]


def report(summary: dict[str, Any], previous: dict[str, Any] | None) -> str:
    lines = [
        "# Queen's own client suites against queen-trio",
        f"checkout {summary['checkout']}, {summary['finished']}, load average at the start "
        f"{summary['load_at_start']}",
        f"command: {summary['command']}",
        "each suite: its own broker on a fresh embedded PostgreSQL (default settings, and a "
        "throwaway QUEEN_ENCRYPTION_KEY)",
        "",
        f"{'suite':<50} {'pass':>5} {'fail':>5} {'skip':>5}  {'run':>4}  time",
    ]
    for s in summary["suites"]:
        c = s["counts"]
        run = c["PASS"] + c["FAIL"]
        lines.append(f"{s['key'] + ': ' + s['title']:<50} {c['PASS']:>5} {c['FAIL']:>5} "
                     f"{c['SKIP']:>5}  {run:>4}  {s['seconds']:.0f} s"
                     + ("" if s.get("checkout") == summary["checkout"]
                        else f"  (kept from checkout {s.get('checkout')})")
                     + ("" if s["exit"] in (0, 1) else f"  (exit: {s['exit']})"))
        if s.get("broker_stopped_early"):
            lines.append(f"  ! the broker stopped during this suite, not by the runner: "
                         f"{s['broker_stopped_early']}")
    for s in summary["suites"]:
        changed = changes(previous, s)
        if changed:
            lines += ["", f"## {s['key']}: changed since the previous results"] + changed
    lines += ["", "## Failures: test -> first error line"]
    for s in summary["suites"]:
        lines += [f"{s['key']} {t['name']} -> {t['detail']}" for t in s["tests"]
                  if t["status"] == "FAIL"]
    lines += ["", "## Every test"]
    for s in summary["suites"]:
        lines += [f"{t['status']} {s['key']} {t['name']}"
                  + (f"  ({t['detail']})" if t["status"] == "SKIP" else "") for t in s["tests"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suites", type=Path, default=DEFAULT_SUITES,
                        help="the assembled suites (default /work/queen-suites)")
    parser.add_argument("--only", default="", help="comma-separated suite keys: py26,py015,js015")
    parser.add_argument("-k", dest="selection", default=None,
                        help="pytest -k expression, or for js015 comma-separated test or "
                             "module names")
    parser.add_argument("--out", type=Path, default=None,
                        help="the report, the JSON beside it (default bench/results/"
                             "queen_suites.txt; with -k, queen_suites_partial.txt)")
    args = parser.parse_args()
    out = args.out or RESULTS / ("queen_suites_partial.txt" if args.selection
                                 else "queen_suites.txt")
    # The broker subprocesses run this checkout's queen_trio, whatever is installed.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    # Queen's encryption tests assume a broker started with a key (Queen stores plaintext
    # without one; ours refuses encryptionEnabled instead). A throwaway key per run.
    os.environ.setdefault("QUEEN_ENCRYPTION_KEY", secrets.token_hex(32))
    wanted = [s for s in SUITES if not args.only or s.key in args.only.split(",")]
    json_path = out.with_suffix(".json")
    previous = json.loads(json_path.read_text()) if json_path.exists() else None
    log_dir = Path(tempfile.mkdtemp(prefix="queen-suites-"))
    summary: dict[str, Any] = {
        "checkout": source_revision(), "load_at_start": load(),
        "command": "python -m bench.queen_suites " + " ".join(sys.argv[1:]),
        "suites": []}
    for suite in wanted:
        print(f"{suite.key}: running ({suite.title}) ...", flush=True)
        result = run_suite(suite, args.suites, args.selection, log_dir)
        c = result["counts"]
        print(f"{suite.key}: {c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped in "
              f"{result['seconds']:.0f} s (logs in {log_dir})", flush=True)
        result["checkout"] = summary["checkout"]
        summary["suites"].append(result)
    summary["finished"] = now_iso()
    # A run of some suites keeps the others' last results (each names its own checkout).
    ran = {s["key"] for s in summary["suites"]}
    kept = [s for s in (previous or {}).get("suites", []) if s["key"] not in ran]
    summary["suites"] = sorted(summary["suites"] + kept,
                               key=lambda s: [x.key for x in SUITES].index(s["key"]))
    text = report(summary, previous)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    save_json(json_path, summary)
    print(text)


if __name__ == "__main__":
    main()
