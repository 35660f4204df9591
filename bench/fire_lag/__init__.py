"""Timer wake-up latency beside a peer (Procrastinate): one bench script in parts.

* ``suite``: the scenarios and the command line (``python -m bench.fire_lag``);
* ``parties``: ours vs the peer, each scheduling and receiving timers its own way;
* ``report``: tables, plots and the generated sections of docs/performance.md.

The peer's worker process and its client are ``bench.harness.peer_procrastinate``
(``bench.peer_graphile`` runs them too).

What it shares with the other scripts comes from ``bench.harness``.
"""
