"""Timer wake-up latency beside a peer (Procrastinate): one bench script in parts.

* ``suite``: the scenarios and the command line (``python -m bench.fire_lag``);
* ``parties``: ours vs the peer, each scheduling and receiving timers its own way;
* ``report``: tables, plots and the generated sections of docs/performance.md;
* ``peer_procrastinate``: the peer's worker process and its client.

What it shares with the other scripts comes from ``bench.harness``.
"""
