"""A batch of timers due at one instant is counted whole in the fire-lag histogram
(``/metrics``) and in the tenant's figures (``GET /api/v1/stats``), the two alike."""

from __future__ import annotations

import httpx
import trio

from ..timer_ops import timer_op
from .test_log import API
from .test_timers import TIMERS, wait_for_messages

N = 200
NAME = "queen_timers_fire_lag_seconds"


async def test_a_burst_sharing_one_deliver_at_is_counted_whole(http: httpx.AsyncClient) -> None:
    r = await http.post(TIMERS, json={"operations": [
        timer_op("lag-burst", f"k{i}", 300, i) for i in range(N)]})
    results = r.json()["results"]
    assert [x["status"] for x in results] == ["scheduled"] * N
    assert len({x["deliverAt"] for x in results}) == 1  # one statement, one instant
    await wait_for_messages(http, "lag-burst", N, timeout=20)
    with trio.fail_after(10):
        while f"queen_timers_fired_total {N}.0" not in (text := (await http.get("/metrics")).text):
            await trio.sleep(0.02)
    buckets: dict[float, float] = {}
    count = total_s = None
    for line in text.splitlines():
        if line.startswith(f"{NAME}_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets[float(le)] = float(line.split()[-1])
        elif line.startswith(f"{NAME}_count "):
            count = float(line.split()[-1])
        elif line.startswith(f"{NAME}_sum "):
            total_s = float(line.split()[-1])
    assert count == N and buckets[float("inf")] == N
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative
    assert total_s is not None and 0 <= total_s <= N * 10  # lags within 10 s each (a busy box)
    stats = (await http.get(f"{API}/stats")).json()["timerFireLag"]
    assert stats["count"] == N
    assert {float(k): float(v) for k, v in stats["buckets"].items()} == buckets
