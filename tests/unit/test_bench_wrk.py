"""bench.put_throughput reads wrk's report; a misread would report a wrong PUT rate."""

from __future__ import annotations

from bench.put_throughput import parse_wrk

WRK = """Running 10s test @ http://127.0.0.1:6701
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    27.06ms   11.23ms 115.03ms   86.46%
    Req/Sec   606.12     90.10   830.00     71.00%
  Latency Distribution
     50%   24.91ms
     75%   31.02ms
     90%   40.11ms
     99%    1.02s
  12063 requests in 10.01s, 3.63MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 5
Requests/sec:   1205.16
"""


def test_parse_wrk_reads_counts_rate_and_latency_in_milliseconds() -> None:
    r = parse_wrk(WRK)
    assert (r["requests"], r["seconds"], r["non_2xx"], r["socket_errors"]) == (12063, 10.01, 5, 3)
    assert r["rate"] == round(12063 / 10.01, 1)
    assert r["latency_ms"] == {"p50": 24.91, "p75": 31.02, "p90": 40.11, "p99": 1020.0,
                               "max": 115.03}


def test_parse_wrk_without_errors_or_minutes() -> None:
    text = WRK.replace("  Socket errors: connect 0, read 2, write 0, timeout 1\n", "") \
              .replace("  Non-2xx or 3xx responses: 5\n", "").replace("10.01s", "1.00m")
    r = parse_wrk(text)
    assert (r["non_2xx"], r["socket_errors"], r["seconds"]) == (0, 0, 60.0)
