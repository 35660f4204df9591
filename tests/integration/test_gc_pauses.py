"""The collector's pauses on /metrics (queen_trio/gc_pauses.py): every collection the broker
process runs is timed by generation, so a fire-lag outlier can be matched with one. A broker
subprocess, so the collector is its own."""

from __future__ import annotations

import re

import httpx

from ..brokers import running_brokers

API = "/api/v1"


def sample(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^{name}\{{{want}\}} (\S+)$", text, re.M)
    assert found, f"{name} {labels} not on /metrics"
    return float(found.group(1))


async def test_collector_pauses_are_counted_by_generation(database_url: str) -> None:
    async with running_brokers(database_url, 1) as (broker,):
        async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
            before = (await http.get("/metrics")).text
            (await http.post(f"{API}/configure", json={"queue": "gc"})).raise_for_status()
            for i in range(200):  # enough allocation for young collections to run
                r = await http.post(f"{API}/push", json={"items": [{"queue": "gc",
                                                                     "payload": {"i": i}}]})
                assert r.status_code == 201
            after = (await http.get("/metrics")).text
    for generation in "012":  # every generation is shown from the start
        sample(before, "queen_gc_pause_seconds_count", generation=generation)
    young = sample(after, "queen_gc_pause_seconds_count", generation="0")
    assert young > sample(before, "queen_gc_pause_seconds_count", generation="0")
    # Pauses, not wall-clock time between collections: the sum stays small.
    assert 0 < sample(after, "queen_gc_pause_seconds_sum", generation="0") < 0.1 * young
