"""The broker's memory for 16 MiB messages: its peak RSS while it takes one push, then several
at once, and while they are popped (RELIABILITY.md, "Large messages").

    python -m bench.large_messages                    # 16 MiB, 1 then 4 at once, plain queue
    python -m bench.large_messages --encrypted        # the same on an encryptionEnabled queue
    python -m bench.large_messages --concurrent 8 --json out.json

A broker subprocess on its own embedded PostgreSQL (or QUEEN_BENCH_URL's broker is not used:
the peak is read from the subprocess's /proc status). Before each phase the kernel's peak
(VmHWM) is reset (``/proc/<pid>/clear_refs``), so each figure is that phase's own peak; the
growth is that peak minus the RSS just before the phase.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.harness.brokers import broker_process

API = "/api/v1"
MIB = 1024 * 1024


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


async def phase(pid: int, name: str, work: Any, results: dict[str, Any]) -> None:
    reset_peak(pid)
    before = status_kib(pid, "VmRSS")
    started = time.monotonic()
    await work()
    took = time.monotonic() - started
    peak = status_kib(pid, "VmHWM")
    results[name] = {"rss_before_mib": round(before / 1024, 1),
                     "peak_mib": round(peak / 1024, 1),
                     "growth_mib": round((peak - before) / 1024, 1), "seconds": round(took, 2)}
    print(f"{name:28} rss before {before / 1024:7.1f} MiB  peak {peak / 1024:7.1f} MiB  "
          f"(+{(peak - before) / 1024:6.1f})  {took:5.2f} s", flush=True)


async def run(size: int, concurrent: int, encrypted: bool) -> dict[str, Any]:
    if encrypted:
        os.environ.setdefault("QUEEN_ENCRYPTION_KEY", "ab" * 32)
    payload = "x" * (size - 2 - 64)  # a JSON string: with the object around it, ~size bytes
    results: dict[str, Any] = {"message_bytes": size, "concurrent": concurrent,
                               "encrypted": encrypted}
    with broker_process(None) as handle:
        assert handle.pid is not None
        pid = handle.pid
        async with httpx.AsyncClient(base_url=handle.url, timeout=300) as http:
            for q in ("one", "many"):
                r = await http.post(f"{API}/configure", json={
                    "queue": q, "options": {"encryptionEnabled": encrypted}})
                r.raise_for_status()
            body = json.dumps({"items": [{"queue": "one", "payload": payload}]}).encode()
            results["body_bytes"] = len(body)
            results["rss_idle_mib"] = round(status_kib(pid, "VmRSS") / 1024, 1)

            async def push_one(queue: str, partition: str = "Default") -> None:
                data = body.replace(b'"queue": "one"', json.dumps(
                    {"queue": queue, "partition": partition})[1:-1].encode(), 1)
                r = await http.post(f"{API}/push", content=data,
                                    headers={"content-type": "application/json"})
                assert r.status_code == 201, r.text[:200]

            async def pop_one(queue: str, partition: str = "Default") -> None:
                r = await http.get(f"{API}/pop/queue/{queue}/partition/{partition}",
                                   params={"autoAck": "true"})
                assert r.status_code == 200, r.text[:200]
                assert len(r.content) > size - 1024

            await phase(pid, "push 1", lambda: push_one("one"), results)
            await phase(pid, "pop 1", lambda: pop_one("one"), results)

            async def many(fn: Any) -> None:  # one partition each: the pops run side by side
                async with trio.open_nursery() as nursery:
                    for i in range(concurrent):
                        nursery.start_soon(fn, "many", f"p{i}")

            await phase(pid, f"push {concurrent} at once", lambda: many(push_one), results)
            await phase(pid, f"pop {concurrent} at once", lambda: many(pop_one), results)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=float, default=16)
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--encrypted", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = trio.run(run, int(args.size_mib * MIB), args.concurrent, args.encrypted)
    results["load_avg"] = os.getloadavg()
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
