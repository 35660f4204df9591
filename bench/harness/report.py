"""What every report has: the failures (with the request and the answer), the checkout and
machine it ran on, the load average, PASS/FAIL, and the JSON it saves."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

import httpx
import trio

from bench.harness.brokers import BrokerProcess
from bench.harness.pg import server_version


class Reply(Protocol):
    """An HTTP answer as the harness reads it: ``httpx.Response`` or the SDK's lean ``Answer``."""

    @property
    def status_code(self) -> int: ...
    @property
    def text(self) -> str: ...
    def json(self) -> Any: ...

class Failures:
    """What went wrong, with the request and the broker's answer. The first few of each kind
    are kept verbatim; all are counted."""

    KEEP = 5

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: list[dict[str, Any]] = []

    def add(self, scenario: str, kind: str, detail: str, **request: Any) -> None:
        key = f"{scenario}: {kind}"
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.counts[key] <= self.KEEP:
            self.examples.append({"scenario": scenario, "kind": kind, "detail": detail, **request})

    def bad_response(self, scenario: str, method: str, path: str, body: Any,
                     response: Reply, why: str) -> None:
        self.add(scenario, f"{method} {path.split('?')[0]} -> {response.status_code}", why,
                 request=f"{method} {path}", request_body=clip(body),
                 status=response.status_code, response_body=clip(response.text))

    def exception(self, scenario: str, method: str, path: str, body: Any,
                  exc: BaseException) -> None:
        self.add(scenario, f"{method} {path.split('?')[0]} raised {type(exc).__name__}",
                 str(exc) or repr(exc), request=f"{method} {path}", request_body=clip(body))

    def total(self) -> int:
        return sum(self.counts.values())

    def print_details(self, *, examples: int | None = None, width: int | None = None) -> None:
        """The total, the count of each kind, then the kept examples as JSON (the first
        ``examples`` of them, each cut to ``width`` characters)."""
        print(f"failures: {self.total()}")
        for key, n in self.counts.items():
            print(f"   {n:>6} x {key}")
        for ex in self.examples[:examples]:
            print(f"   - {json.dumps(ex)[:width]}")


def clip(value: Any, limit: int = 600) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


def json_or_none(response: Reply) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def source_revision() -> str:
    """The checkout's commit, marked dirty when queen_trio/ has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                                capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "queen_trio", "schema"],
                               cwd=root, text=True, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}{' + uncommitted changes' if dirty.strip() else ''}"


def machine_info(handle: BrokerProcess) -> dict[str, Any]:
    return {
        "checkout": source_revision(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "httpx": httpx.__version__,
        "trio": trio.__version__,
        "broker": handle.source,
        "postgresql": server_version(handle.database_url, handle.log_path is not None),
        "load_avg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def json_default(value: Any) -> Any:
    """For ``json.dumps(default=...)``: a non-finite float as null, anything else as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def save_json(path: Path, summary: dict[str, Any], *, indent: int = 2) -> None:
    """The summary as JSON (and a newline) at ``path``, its folder made if need be."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=indent, default=json_default) + "\n")
