"""Schedule, cancel and push through the SDK, this checkout beside a baseline checkout, rounds
interleaved (issue 32: single-call latency, schedule throughput, pushes and partition creation).

Each side is a broker subprocess started from its own checkout, on its own database of one
shared PostgreSQL server, driven by a client subprocess that imports the SDK of the same
checkout (so a change to the SDK is measured too). Scenarios (``--scenario``, default all):

- ``routes``: the broker's CPU per request, route by route, one keep-alive client sending
  ``--calls`` requests of each back to back (broker CPU from /proc): a route that does not
  exist, ``/health``, a timer peek, a 1-timer ``POST /api/v1/timers``, a cancel (``DELETE``),
  a ``PUT``, a pop with nothing ready (``wait=false``), a lone ack.
- ``single``: one schedule an hour ahead, one cancel of it, one schedule due within the
  sweeper's sleep (``--soon-ms``: the sweeper is woken for it), its cancel, one push, 10 ms
  apart (``--gap-ms``: 250 leaves every process's caches as cold as a broker called now and
  then finds them), sequential (an idle broker between calls): p50/p90/p99/max of each call, and the
  CPU per call of the client, the broker and PostgreSQL. ``--client sync``: the same calls
  through ``SyncClient`` (blocking) instead of the async ``Client``; ``--client raw``: the same
  requests from a bare blocking socket (no SDK: ``json.dumps`` and a minimal read of the
  answer), the floor any client could reach. ``--firing R``: the same
  while the broker fires R timers a second, scheduled ahead in bundles onto another queue and
  consumed by an SDK consumer process at its defaults (``bench.harness.sdk_consumer``), as in
  ``bench.peer_graphile``'s idle scenario; the timers fired are counted.
- ``push``: pushes of one message each, ``--concurrency`` at once (50, as Queen's JS client's
  bootstrap test), first into ``--partitions`` new partitions, then into the same ones again:
  pushes/s and latency.
- ``bundle``: 500-timer transaction bundles built with the SDK's builder, 1 and 4 clients for
  ``--seconds``: timers/s, and CPU per timer of the client, the broker and PostgreSQL.
- ``notify``: without a broker, 20 connections committing a one-row insert, with a NOTIFY
  inside the transaction, without one, and with it sent after the commit in a transaction of
  its own with synchronous_commit off (queen_trio/db/notifier.py): transactions/s.

``python -m bench.sched_path --baseline /work/main [--rounds 2] [--scenario single push]``;
the table goes to stdout and the numbers to ``bench/results/sched_path.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from bench.harness.brokers import side_broker, stop_process
from bench.harness.cpu import PartyCpu
from bench.harness.pg import shared_server
from bench.harness.raw_client import RawClient
from bench.harness.report import load, now_iso, save_json, source_revision
from bench.harness.stats import distribution

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "sched_path.json"
SCENARIOS = ("routes", "single", "push", "bundle", "notify")
BUNDLE = 500


# -- the client (a subprocess importing the SDK of the side under test) ----------------------


async def _client(url: str, scenario: str, args: dict[str, Any]) -> dict[str, Any]:
    import trio

    import queen_trio

    out: dict[str, Any] = {}
    async with queen_trio.Client(url) as q:
        await q.timer("warm").key("w").delay("1h").payload({"w": 1}).schedule()
        await q.push("warm", {"w": 1})
        if scenario == "routes":
            out = await _routes(q, url, args)
        elif scenario == "single" and args.get("client") == "raw":
            with RawClient(url) as raw:
                out = await _single(raw, args)
        elif scenario == "single" and args.get("client") == "sync":
            with queen_trio.SyncClient(url) as blocking:
                blocking.timer("warm").key("w").delay("1h").payload({"w": 1}).schedule()
                out = await _single(blocking, args)
        elif scenario == "single":
            out = await _single(q, args)
        elif scenario == "push":
            queue, n, c = f"boot-{args['tag']}", args["partitions"], args["concurrency"]
            for phase in ("new", "existing"):
                samples: list[float] = []

                async def one(j: int, samples: list[float] = samples) -> None:
                    t = time.perf_counter()
                    await q.push(queue, {"id": j}, partition=f"p-{j}")
                    samples.append(time.perf_counter() - t)

                t0 = time.perf_counter()
                for i in range(0, n, c):  # as the JS bootstrap test: groups of c at once
                    async with trio.open_nursery() as nursery:
                        for j in range(i, min(i + c, n)):
                            nursery.start_soon(one, j)
                wall = time.perf_counter() - t0
                out[phase] = {"pushes_per_s": round(n / wall), "wall_s": round(wall, 2),
                              **distribution(samples)}
        elif scenario == "bundle":
            clients, seconds = args["clients"], args["seconds"]
            done = [0]
            stop = time.perf_counter() + seconds

            async def bundles(c: int) -> None:
                b = 0
                while time.perf_counter() < stop:
                    tx = q.transaction()
                    for j in range(BUNDLE):
                        tx = tx.timer("bundle").key(f"{args['tag']}-{c}-{b}-{j}").delay(
                            "1h").payload({"i": j}).schedule()
                    await tx.commit()
                    done[0] += BUNDLE
                    b += 1

            t0, cpu0 = time.perf_counter(), time.process_time()
            async with trio.open_nursery() as nursery:
                for c in range(clients):
                    nursery.start_soon(bundles, c)
            wall = time.perf_counter() - t0
            out = {"timers": done[0], "timers_per_s": round(done[0] / wall),
                   "client_cpu_s": time.process_time() - cpu0, "wall_s": wall}
    return out


SINGLE = ("schedule", "cancel", "schedule soon", "cancel soon", "push")


async def _single(q: Any, args: dict[str, Any]) -> dict[str, Any]:
    """The ``single`` scenario: each call alone, ``gap_ms`` (10) after the last (an idle broker): a
    schedule an hour ahead and its cancel, a schedule due within the sweeper's sleep ("soon":
    the sweeper must be woken for it) and its cancel, a push. Per call: the round trip, the
    client's CPU, and the broker's and PostgreSQL's CPU (schedstat, read outside the timing)."""
    import trio

    pid, postmaster = args["pid"], args.get("postmaster")
    lat: dict[str, list[float]] = {what: [] for what in SINGLE}
    cpu: dict[str, dict[str, float]] = {what: {"client": 0.0, "broker": 0.0, "postgres": 0.0}
                                        for what in SINGLE}
    soon_ms = args.get("soon_ms", 500)
    gap_s = args.get("gap_ms", 10) / 1000

    def parties() -> tuple[float, float]:
        return _cpu_s(pid), (_tree_cpu_s(postmaster) if postmaster else 0.0)

    fired = await _firing_ahead(q, args)
    broker0, pg0 = parties()
    for i in range(args["calls"]):
        key = f"single-{args['tag']}-{i}"
        for what in SINGLE:
            await trio.sleep(gap_s)
            c, t = time.process_time(), time.perf_counter()
            if what == "schedule":
                await _done(q.timer("single").key(key).delay("1h").payload({"i": i}).schedule())
            elif what == "schedule soon":
                await _done(q.timer("single").key(key + "s").delay(soon_ms).payload(
                    {"i": i}).schedule())
            elif what == "cancel":
                await _done(q.timer("single").key(key).cancel())
            elif what == "cancel soon":
                await _done(q.timer("single").key(key + "s").cancel())
            else:
                await _done(q.push("single", {"i": i}))
            lat[what].append(time.perf_counter() - t)
            cpu[what]["client"] += time.process_time() - c
            broker1, pg1 = parties()
            cpu[what]["broker"] += broker1 - broker0
            cpu[what]["postgres"] += pg1 - pg0
            broker0, pg0 = broker1, pg1
    out: dict[str, Any] = {
        what: {**distribution(v), **{f"{party}_cpu_ms": round(s * 1e3 / len(v), 3)
                                     for party, s in cpu[what].items()}}
        for what, v in lat.items()}
    if fired is not None:
        out["firing"] = {"per_s": args["firing"], "scheduled": fired[0],
                         "due_during_calls": fired[1](time.time())}
    return out


FIRING_QUEUE = "firing"

async def _done(result: Any) -> Any:
    """A call's result: awaited from the async Client, as it came from SyncClient."""
    return await result if inspect.isawaitable(result) else result


#: How long the ``single`` scenario's calls take per call (5 calls 10 ms apart and their
#: round trips), to schedule enough timers to fire all along.
_SINGLE_ROUND_S = 0.075


async def _firing_ahead(q: Any, args: dict[str, Any]) -> tuple[int, Any] | None:
    """With ``firing`` (timers/s): timers due one after the other at that rate from half a
    second from now until past the scenario's end, scheduled now in bundles of
    :data:`BUNDLE`; (how many, a function of an epoch time giving how many were due by
    then). None without ``firing``."""
    rate = args.get("firing") or 0
    if rate <= 0:
        return None
    lead_s = 0.5
    round_s = _SINGLE_ROUND_S + len(SINGLE) * (args.get("gap_ms", 10) - 10) / 1000
    n = int(rate * (lead_s + args["calls"] * round_s + 1))
    start = time.time()
    entries = [(f"fire-{args['tag']}-{i}", int((lead_s + i / rate) * 1000), {"i": i})
               for i in range(n)]
    for b in range(0, n, BUNDLE):
        await _done(q.transaction().schedule_many(FIRING_QUEUE, entries[b:b + BUNDLE]).commit())

    def due_by(now: float) -> int:
        return max(0, min(n, int((now - start - lead_s) * rate)))

    return n, due_by


def _tree_cpu_s(root: int) -> float:
    """CPU time of ``root``'s child processes (PostgreSQL's backends), in seconds: the live
    ones' and the ended ones' (reaped: counted in ``root``'s own stat, in clock ticks)."""
    stat = Path(f"/proc/{root}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    total = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[1]) == root:
                total += int((entry / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError):
            pass
    return total


def _cpu_s(pid: int) -> float:
    """CPU time of process ``pid``, its threads summed, in seconds: from schedstat (ns), as
    /proc/PID/stat's 10 ms ticks are too coarse for a few hundred requests."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except OSError:  # a thread that just ended
            pass
    return total / 1e9


async def _routes(q: Any, url: str, args: dict[str, Any]) -> dict[str, Any]:
    """The ``routes`` scenario: broker CPU and wall per request, route by route."""
    n, tag, pid = args["calls"], args["tag"], args["pid"]
    import httpx

    async with httpx.AsyncClient(timeout=60) as http:  # one keep-alive connection
        return await _route_costs(q, http, url, n, tag, pid)


async def _route_costs(q: Any, http: Any, url: str, n: int, tag: str, pid: int
                       ) -> dict[str, Any]:
    json_type = {"content-type": "application/json"}

    def one_timer(key: str) -> bytes:
        return json.dumps({"operations": [{"op": "schedule", "queue": "routes", "key": key,
                                           "delayMs": 3_600_000, "payload": {"k": key}}]}
                          ).encode()

    await http.post(f"{url}/api/v1/timers", content=one_timer("peeked"), headers=json_type)
    for start in range(0, n + 20, 500):
        await q.push_many(f"acks-{tag}", [{"i": i} for i in range(start, min(n + 20, start + 500))])
    leased = list((await q.pop(f"acks-{tag}", batch=n + 20)).messages)
    await q.push("empty-" + tag, {"x": 1})
    await q.pop("empty-" + tag, batch=1, auto_ack=True)
    routes: dict[str, Any] = {
        "404": lambda i: http.get(f"{url}/no-such-route"),
        "health": lambda i: http.get(f"{url}/health"),
        "peek": lambda i: http.get(f"{url}/api/v1/timers/routes/peeked"),
        "schedule 1 (POST)": lambda i: http.post(f"{url}/api/v1/timers",
                                                 content=one_timer(f"{tag}-{i}"),
                                                 headers=json_type),
        "cancel (DELETE)": lambda i: http.delete(f"{url}/api/v1/timers/routes/{tag}-{i}"),
        "PUT": lambda i: http.put(f"{url}/api/v1/timers/routes/put-{tag}-{i}",
                                  json={"payload": {"a": 1}, "delayMs": 3_600_000}),
        "pop, none ready": lambda i: http.get(f"{url}/api/v1/pop/queue/empty-{tag}",
                                              params={"wait": "false"}),
        "lone ack": lambda i: q.ack(leased[i]),
    }
    out: dict[str, Any] = {}
    for name, call in routes.items():
        for i in range(20):  # warm (the cancels then find timers 20.. gone: still a cancel)
            await call(n + i)
        c0, t0 = _cpu_s(pid), time.perf_counter()
        for i in range(n):
            answer = await call(i)
            status = getattr(answer, "status_code", 200)
            assert status < 500, (name, status)
        wall, cpu = time.perf_counter() - t0, _cpu_s(pid) - c0
        out[name] = {"wall_ms": round(wall * 1e3 / n, 3), "broker_cpu_ms": round(cpu * 1e3 / n, 3)}
    return out


def child_main(url: str, scenario: str, args: str) -> None:
    import trio

    print(json.dumps(trio.run(_client, url, scenario, json.loads(args))), flush=True)


# -- the parent --------------------------------------------------------------------------------


@contextlib.contextmanager
def side_consumer(checkout: Path, url: str, firing: int) -> Iterator[None]:
    """With ``firing``: an SDK consumer process of ``checkout`` on the firing queue."""
    if firing <= 0:
        yield
        return
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.harness.sdk_consumer", "--url", url, "--queue",
         FIRING_QUEUE], cwd=checkout, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        stop_process(proc)



def run_client(checkout: Path, url: str, scenario: str, args: dict[str, Any]) -> dict[str, Any]:
    """This script as a client of ``url``, importing ``checkout``'s SDK (and nothing else)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, __file__, "--child", url, scenario, json.dumps(args)],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"client failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def notify_round(url: str, mode: str, connections: int = 20, seconds: float = 4.0) -> float:
    stop = time.perf_counter() + seconds
    counts = [0] * connections

    def work(i: int) -> None:
        with psycopg.connect(url) as conn:
            while time.perf_counter() < stop:
                conn.execute("INSERT INTO notify_bench (v) VALUES ('x')")
                if mode == "inside":
                    conn.execute("SELECT pg_notify('bench', 'q')")
                conn.commit()
                if mode == "after":
                    conn.execute("SELECT set_config('synchronous_commit', 'off', true), "
                                 "pg_notify('bench', 'q')")
                    conn.commit()
                counts[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="checkout to compare with")
    parser.add_argument("--scenario", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--soon-ms", type=int, default=500,
                        help="single: the delay of a schedule due within the sweeper's sleep")
    parser.add_argument("--gap-ms", type=int, default=10,
                        help="single: the pause before each call (250: caches gone cold)")
    parser.add_argument("--client", choices=("async", "sync", "raw"), default="async",
                        help="single: the calls through Client (async), SyncClient, or a bare "
                             "blocking socket (raw)")
    parser.add_argument("--firing", type=int, default=0,
                        help="single: timers/s the broker fires meanwhile (0: none)")
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--admin-url", default=os.environ.get("QUEEN_DATABASE_URL"))
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="where the JSON goes (default bench/results/sched_path.json)")
    opts = parser.parse_args()
    sides = {"this": REPO, "baseline": opts.baseline.resolve()}
    report: dict[str, Any] = {"when": now_iso(), "revision": source_revision(),
                              "firing_per_s": opts.firing, "client": opts.client,
                              "baseline": str(sides["baseline"]), "load_start": load(),
                              "rounds": []}
    with shared_server(opts.admin_url) as server:
        if "notify" in opts.scenario:
            with server.database("notify") as url:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("CREATE TABLE notify_bench (id bigserial PRIMARY KEY, v text)")
                rows = {m: [] for m in ("none", "inside", "after")}  # type: dict[str, list[float]]
                for _ in range(opts.rounds):
                    for mode in rows:
                        rows[mode].append(round(notify_round(url, mode)))
                report["notify_tx_per_s"] = rows
                print("commits/s, 20 connections (rounds):", rows, "load", load(), flush=True)
        scenarios = [s for s in opts.scenario if s != "notify"]
        with server.database("sched_this") as db_this, \
                server.database("sched_base") as db_base, \
                side_broker(sides["this"], db_this) as this, \
                side_broker(sides["baseline"], db_base) as base, \
                side_consumer(sides["this"], this[0], opts.firing), \
                side_consumer(sides["baseline"], base[0], opts.firing):
            brokers = {"this": this, "baseline": base}
            for r in range(opts.rounds):
                for scenario in scenarios:
                    for side in (("this", "baseline") if r % 2 == 0 else ("baseline", "this")):
                        url, pid = brokers[side]
                        for clients in ((1, 4) if scenario == "bundle" else (0,)):
                            args = {"tag": f"{side}{r}c{clients}", "calls": opts.calls,
                                    "pid": pid, "postmaster": server.postmaster_pid,
                                    "soon_ms": opts.soon_ms, "gap_ms": opts.gap_ms,
                                    "firing": opts.firing, "client": opts.client,
                                    "partitions": opts.partitions,
                                    "concurrency": opts.concurrency, "clients": clients,
                                    "seconds": opts.seconds}
                            cpu = PartyCpu([pid], server.postmaster_pid)
                            before = cpu.snapshot()
                            result = run_client(sides[side], url, scenario, args)
                            after = cpu.snapshot()
                            row = {"round": r, "side": side, "scenario": scenario,
                                   "clients": clients, "load": load(), **result,
                                   "cpu_s": {k: round(after[k] - before[k], 3)
                                             for k in ("broker", "postgres", "other")}}
                            if scenario == "bundle" and result["timers"]:
                                n = result["timers"]
                                row["cpu_us_per_timer"] = {
                                    "client": round(result["client_cpu_s"] / n * 1e6, 1),
                                    **{k: round(v / n * 1e6, 1)
                                       for k, v in row["cpu_s"].items()}}
                            report["rounds"].append(row)
                            print(json.dumps(row), flush=True)
    report["load_end"] = load()
    save_json(opts.out, report)
    print(f"load {report['load_start']} -> {report['load_end']}; saved {opts.out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child_main(*sys.argv[2:])
    else:
        main()
