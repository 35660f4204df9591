"""What the bench scripts share; a script imports from here, never from another script.

* ``brokers``: broker subprocesses (one on its own embedded PostgreSQL, or several on one
  database), free ports, health wait, log tails and first errors, the open-files limit.
* ``pg``: the PostgreSQL server shared by several parties, throw-away databases on it.
* ``cpu``: CPU seconds per party from /proc (``CpuMeter``, ``PartyCpu``) and the report cell.
* ``stats``: the one percentile (nearest rank) and the distribution/quantile summaries.
* ``report``: ``Failures``, checkout and machine info, load average, PASS/FAIL.
* ``metrics``: the broker's /metrics (Prometheus text) and its timer summaries.
* ``api``: the broker's HTTP API, every answer checked (timer benchmarks).
* ``timers``: exactly-once bookkeeping of timers (``Delivery``), consumers, drain checks,
  a scenario's context (time limit, watchdog), timed client loops, calibration.
* ``lines``: a child process that prints READY then one record per line (SDK consumer,
  the peer's worker).
* ``sdk_consumer``: ``Client.consume()`` at its defaults as a child process (``SdkConsumer``).
* ``collector``: the client's garbage collector paused during a scenario.
* ``spacing``: due instants kept apart for the idle scenarios.
"""
