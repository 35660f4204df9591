"""What the strict request decoder (queen_trio.strict_json) costs against ``json.loads`` (what
``read_json_body`` ran before), without HTTP: one process, CPU only, the variants interleaved
``--rounds`` times, each round the best of 5 timings of this process's CPU time (so other
work on the machine weighs less).

Bodies: a push of one event as the SDK sends it (``Client.push``), a push of 100 events as
``bench.log_throughput`` sends them, the same 100 events written by a client that escapes
non-ASCII (Python's ``json.dumps`` default: every 'é' a ``\\u00e9``) and carrying an emoji
(an escaped surrogate pair, which makes the decoder walk every string), and a KV put of a
200,000-key object (the hostile-input test's).

A second table follows a push further: decoding, validating the items and the payload text
the store writes. Before, that text was serialized twice (once to measure it against the
ceiling, once by the store); now the measured text is the stored one.

    python -m bench.json_decode [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import json
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness.api import event
from bench.harness.report import source_revision
from bench.harness.stats import median
from queen_trio import strict_json
from queen_trio.log import rules as log_rules

RESULTS = Path(__file__).parent / "results" / "json_decode.txt"
CEILING = 1024 * 1024


def bodies() -> dict[str, tuple[bytes, int]]:
    def push(n: int) -> dict[str, Any]:
        return {"items": [{"queue": "orders", "partition": f"p{i % 8}",
                           "payload": event(i, "push[mixed,C=8]")} for i in range(n)]}

    accented = push(100)
    for item in accented["items"]:
        item["payload"]["customerName"] = "Zoë Ångström-Núñez 🙂"
    compact: dict[str, Any] = {"separators": (",", ":"), "ensure_ascii": False}
    return {
        "push, 1 event (SDK)": (json.dumps(push(1), **compact).encode(), 20_000),
        "push, 100 events": (json.dumps(push(100), **compact).encode(), 300),
        "push, 100 events, \\u-escaped": (json.dumps(accented).encode(), 300),
        "kv put, 200,000 keys": (json.dumps({"value": {f"k{i}": i for i in range(200_000)}},
                                            **compact).encode(), 3),
    }


def push_path_before(body: bytes) -> None:
    """Before: json.loads, the items validated, each payload serialized once to measure it
    against the ceiling and again by the store to write it (log/store.append)."""
    for item in log_rules.push_items(json.loads(body), CEILING):
        len(json.dumps(item.payload, separators=(",", ":"), ensure_ascii=False).encode())


def push_path_after(body: bytes) -> None:
    """Now: the strict decoder, the items validated, and the text that was measured is the
    text the store writes."""
    for item in log_rules.push_items(strict_json.loads(body), CEILING):
        len(item.payload_json.encode())


def table(variants: dict[str, Callable[[bytes], Any]], bodies: dict[str, tuple[bytes, int]],
          rounds: int, title: str) -> list[str]:
    lines = ["", f"{title}:", f"{'body':34s} {'bytes':>9s} "
             + " ".join(f"{v:>18s}" for v in variants) + f" {'ratio':>7s}"]
    for name, (body, number) in bodies.items():
        samples: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(rounds):
            for label, run in variants.items():
                best = min(timeit.repeat(functools.partial(run, body), number=number, repeat=5,
                                         timer=time.process_time))
                samples[label].append(best / number * 1e6)
        medians = [median(samples[v]) for v in variants]
        lines.append(f"{name:34s} {len(body):>9,d} " + " ".join(f"{m:>18.2f}" for m in medians)
                     + f" {medians[1] / medians[0]:>7.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    lines = [f"checkout {source_revision()}; µs per body, median of {args.rounds} rounds "
             "(each the best of 5)"]
    every = bodies()
    lines += table({"json.loads": json.loads, "strict_json.loads": strict_json.loads},
                   every, args.rounds, "the decoder alone")
    pushes = {k: v for k, v in every.items() if k.startswith("push")}
    lines += table({"before": push_path_before, "now": push_path_after}, pushes, args.rounds,
                   "a push's decode and validation, and the stored text (no HTTP, no database)")
    with open("/proc/loadavg") as f:
        lines += ["", f"load average: {' '.join(f.read().split()[:3])}"]
    text = "\n".join(lines)
    print(text)
    RESULTS.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
