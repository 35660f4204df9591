"""Tables, plots and the generated README section of ``bench.fire_lag``, all from its JSON.

Everything here reads bench/results/fire_lag.json and fire_lag_explore.json, so
``python -m bench.fire_lag --readme-only`` redraws the same output without measuring again.
matplotlib is optional (the ``bench`` extra): without it the plots are skipped, not the rest.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bench.harness.stats import qname

# The generated sections live in the performance page (docs/performance.md).
RESULTS = Path(__file__).resolve().parents[1] / "results"
README = Path(__file__).resolve().parents[2] / "docs" / "performance.md"
PARTIES = ("ours", "ours-w2", "ours-sync", "ours-wire", "peer-default", "peer-best")
LABELS = {"ours": "queen-trio, Client.consume() at its defaults (handler start)",
          "ours-w2": "queen-trio, Client.consume() against QUEEN_WORKERS=2 (handler start)",
          "ours-sync": "queen-trio, SyncClient.consume() at its defaults (handler start)",
          "ours-wire": "queen-trio, wire-level autoAck consumer (answer received)",
          "peer-default": "Procrastinate, default settings (job start)",
          "peer-best": "Procrastinate, best latency settings (job start)"}
DRAIN_LABELS = {"ours": "queen-trio (fire instant: the frame's createdAt)",
                "ours-w2": "queen-trio, QUEEN_WORKERS=2 (fire instant)",
                "ours-sync": "queen-trio, sync consumer (fire instant)",
                "ours-wire": "queen-trio, wire consumer (fire instant)",
                "peer-default": LABELS["peer-default"],
                "peer-best": LABELS["peer-best"]}
PEER_UNITS = ("idle", "steady-1000", "steady-500", "burst")
QS = (50, 90, 99, 99.9)
BEGIN, END = "<!-- fire_lag:begin -->", "<!-- fire_lag:end -->"
XBEGIN, XEND = "<!-- fire_lag_explore:begin -->", "<!-- fire_lag_explore:end -->"
# Issue 18, due instant to handler start through consume() at its defaults.
TARGET_IDLE = {"p50": 3.0, "p99": 8.0}
TARGET_STEADY_500 = {"p50": 8.0, "p99": 25.0}
TARGET_BURST_HANDLED = 10_000  # timers/s handled by one consume() against one broker
TARGET_BURST_HANDLED_W2 = 15_000  # the same against QUEEN_WORKERS=2
TARGET_BURST_CPU_MS = 0.1      # broker CPU per timer consumed (an upper bound: fires included)


def ms_cell(value: Any) -> str:
    if value is None:
        return "> wait"
    if isinstance(value, int | float):
        return f"{value:,.1f}" if value < 10_000 else f"{value:,.0f}"
    return "-"


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# -- tables (markdown) ------------------------------------------------------------------------


def lag_table(scenarios: dict[str, Any]) -> list[str]:
    rows = ["| scenario | party | timers | p50 | p90 | p99 | p99.9 | max | broker metric p50 / p99"
            " / p99.9 | lost / dup | not started in wait | CPU client/service/pg/other | load "
            "(1 min) |",
            "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|"]
    for unit, parties in scenarios.items():
        for party in PARTIES:
            r = parties.get(party)
            if unit == "multi-broker" and r and "steady" in r:
                for sub in ("steady", "burst"):
                    rows.append(_lag_row(f"multi-broker ({r['brokers']}) {sub}", party, r[sub]))
            elif r and "lag" in r:
                rows.append(_lag_row(unit, party, r))
    return rows


def _lag_row(unit: str, party: str, r: dict[str, Any]) -> str:
    lag, d, m = r.get("lag") or {}, r.get("delivery") or {}, r.get("metric_lag") or {}
    metric = (f"{ms_cell(m.get('p50_ms'))} / {ms_cell(m.get('p99_ms'))} / "
              f"{ms_cell(m.get('p99_9_ms'))}" if m.get("count") else "-")
    cores = r.get("cpu_cores") or {}
    cpu = "/".join(f"{cores[k]:.2f}" if k in cores else "-"
                   for k in ("client", "broker", "postgres", "other"))
    return (f"| {unit} | {party} | {lag.get('n', 0):,} | "
            + " | ".join(ms_cell(lag.get(qname(q))) for q in QS)
            + f" | {ms_cell(lag.get('max'))} | {metric} | {d.get('lost')} / "
            f"{d.get('duplicates')} | {d.get('not_started_in_time') or 0:,} | {cpu} | "
            f"{(r.get('load_avg_start') or '-').split()[0]} |")


def ratio_table(scenarios: dict[str, Any]) -> list[str]:
    rows = ["| scenario | peer default / ours, p50 | p99 | peer best / ours, p50 | p99 |",
            "|---|--:|--:|--:|--:|"]
    for unit in PEER_UNITS:
        parties = scenarios.get(unit) or {}
        ours = (parties.get("ours") or {}).get("lag") or {}
        if not ours.get("n") or not any(p in parties for p in ("peer-default", "peer-best")):
            continue
        cells = []
        for party in ("peer-default", "peer-best"):
            theirs = (parties.get(party) or {}).get("lag") or {}
            for q in ("p50", "p99"):
                cells.append(_ratio(theirs.get(q), ours.get(q), theirs))
        rows.append(f"| {unit} | " + " | ".join(cells) + " |")
    return rows


def _ratio(theirs: Any, ours: Any, their_lag: dict[str, Any]) -> str:
    if not their_lag.get("n") or not isinstance(ours, int | float) or ours <= 0:
        return "-"
    if theirs is None:  # beyond the wait: at least (largest lag seen) / ours
        seen = their_lag.get("cdf_ms") or [[0, 0]]
        return f"> {seen[-1][0] / ours:,.0f}x"
    return f"{theirs / ours:,.1f}x"


def burst_table(scenarios: dict[str, Any]) -> list[str]:
    rows = ["| burst | timers | drained | fired/s (first to last fire) | handled/s (first to "
            "last handler or job start) | first fire after due (s) | last timer's lag at the "
            "consumer (s) | service CPU per timer (ms) | lost / dup | scheduling (s) |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    sources = [(p, (scenarios.get("burst") or {}).get(p)) for p in PARTIES]
    multi = (scenarios.get("multi-broker") or {}).get("ours") or {}
    if multi.get("burst"):
        sources.append((f"ours, {multi['brokers']} brokers", multi["burst"]))
    for party, r in sources:
        if not r:
            continue
        d = r.get("delivery") or {}
        last = r.get("last_handled_lag_s", r.get("last_timer_lag_s"))
        last_cell = (f"{last:,.2f}" if last is not None
                     else f"> {r.get('last_seen_lag_s', 0):,.0f} (not drained)")
        rate, handled = r.get("drain_timers_per_s"), r.get("handled_per_s")
        cpu = r.get("service_cpu_ms_per_timer")
        rows.append(f"| {party} | {r.get('timers', 0):,} | {r.get('drained', 0):,} | "
                    f"{f'{rate:,}' if rate else '-'} | {f'{handled:,}' if handled else '-'} | "
                    f"{r.get('first_fire_after_due_s', '-')} | {last_cell} | "
                    f"{'-' if cpu is None else f'{cpu:.3f}'} | "
                    f"{d.get('lost')} / {d.get('duplicates')} | {r.get('scheduling_s', '-')} |")
    return rows


def ours_only(scenarios: dict[str, Any]) -> list[str]:
    out: list[str] = []
    load = (scenarios.get("api-load") or {}).get("ours")
    if load and load.get("during"):
        t, lag = load["during"], load.get("lag") or {}
        quiet = ((scenarios.get(f"steady-{load['rate']}") or {}).get("ours") or {}).get("lag")
        out.append(f"- **api-load**: {load['rate']} timers/s due for {load['seconds']} s while "
                   f"{t['clients']} clients pushed {t.get('push_msgs_per_s', 0):,} msgs/s "
                   f"(100-message batches) and {t['clients']} popped "
                   f"{t.get('pop_msgs_per_s', 0):,} msgs/s: timer lag p50 "
                   f"{ms_cell(lag.get('p50'))} / p99 {ms_cell(lag.get('p99'))} ms end to end"
                   + (f" (without the load: {ms_cell(quiet.get('p50'))} / "
                      f"{ms_cell(quiet.get('p99'))} ms)" if quiet else "") + ".")
    multi = (scenarios.get("multi-broker") or {}).get("ours")
    if multi and multi.get("steady"):
        ok = all(((multi[s].get("delivery") or {}).get(k) == 0)
                 for s in ("steady", "burst") for k in ("lost", "duplicates"))
        out.append(f"- **multi-broker**: {multi['brokers']} brokers on one database; fires per "
                   f"broker {multi.get('fired_per_broker')}; exactly once across them: "
                   f"{'yes' if ok else 'NO'} (lost and duplicated 0 in both phases).")
    race = (scenarios.get("cancel-race") or {}).get("ours")
    if race and race.get("cancel_latency"):
        lat, ans = race["cancel_latency"], race["answers"]
        share = race.get("too_late_share_near_due")
        out.append(f"- **cancel-race**: {race['timers']} cancels at due ±{race['window_ms']:g} ms:"
                   f" latency p50 {ms_cell(lat.get('p50'))} / p99 {ms_cell(lat.get('p99'))} ms;"
                   f" answers {ans}; too_late within ±10 ms of the due instant: "
                   f"{'-' if share is None else f'{share:.1%}'} of {race['near_due_cancels']}; "
                   f"cancelled but fired: {race.get('cancelled_but_fired')}.")
        out.append("")
        out.append("  | cancel offset from due (ms) | n | cancelled | too_late | absent |")
        out.append("  |---|--:|--:|--:|--:|")
        for b in race.get("by_offset", []):
            cells = " | ".join("-" if b[s] is None else f"{b[s]:.0%}"
                               for s in ("cancelled", "too_late", "absent"))
            out.append(f"  | [{b['offset_ms'][0]:g}, {b['offset_ms'][1]:g}) | {b['n']} | "
                       f"{cells} |")
    return out


def targets(scenarios: dict[str, Any], min_sleep: int) -> list[str]:
    """Issue 18's targets, on the lag users feel: due instant to handler start through
    Client.consume() at its defaults (party ``ours``)."""
    out = []

    def check(label: str, value: Any, ok: bool) -> None:
        shown = ms_cell(value) if isinstance(value, float) else value
        out.append(f"- {'PASS' if ok else 'FAIL'} {label}: {shown}")

    def within(value: Any, bound: float) -> bool:
        return isinstance(value, int | float) and value <= bound

    idle = ((scenarios.get("idle") or {}).get("ours") or {}).get("lag")
    if idle:
        for q, bound in TARGET_IDLE.items():
            check(f"idle handler start {q} <= {bound:g} ms", idle.get(q),
                  within(idle.get(q), bound))
    steady = (scenarios.get("steady-500") or {}).get("ours")
    if steady:
        lag, d = steady.get("lag") or {}, steady.get("delivery") or {}
        check("steady 500/s every timer handled, once",
              f"{d.get('received_distinct')} of {d.get('scheduled')}, dup {d.get('duplicates')}",
              d.get("lost") == 0 and d.get("duplicates") == 0)
        for q, bound in TARGET_STEADY_500.items():
            check(f"steady 500/s handler start {q} <= {bound:g} ms", lag.get(q),
                  within(lag.get(q), bound))
    burst = (scenarios.get("burst") or {}).get("ours")
    if burst:
        rate = burst.get("handled_per_s")
        check(f"burst handled >= {TARGET_BURST_HANDLED:,} timers/s by one consume()", rate,
              isinstance(rate, int) and rate >= TARGET_BURST_HANDLED)
        w2 = ((scenarios.get("burst") or {}).get("ours-w2") or {}).get("handled_per_s")
        if w2 is not None or "ours-w2" in (scenarios.get("burst") or {}):
            check(f"burst handled >= {TARGET_BURST_HANDLED_W2:,} timers/s with QUEEN_WORKERS=2",
                  w2, isinstance(w2, int) and w2 >= TARGET_BURST_HANDLED_W2)
        d = burst.get("delivery") or {}
        check("burst lost = 0 and handled twice = 0", f"{d.get('lost')} / {d.get('duplicates')}",
              d.get("lost") == 0 and d.get("duplicates") == 0)
        cpu = burst.get("service_cpu_ms_per_timer")
        check(f"burst broker CPU per timer (fire + pop + settle) <= {TARGET_BURST_CPU_MS} ms",
              "-" if cpu is None else f"{cpu:.3f}", within(cpu, TARGET_BURST_CPU_MS))
    for unit in ("idle",):
        parties = scenarios.get(unit) or {}
        ours = (parties.get("ours") or {}).get("lag") or {}
        theirs = (parties.get("peer-best") or {}).get("lag") or {}
        if theirs.get("n") and ours.get("n"):
            for q in ("p50", "p99"):
                a, b = ours.get(q), theirs.get(q)
                check(f"{unit} {q} lower than peer-best", f"{ms_cell(a)} vs {ms_cell(b)} ms",
                      isinstance(a, int | float) and (b is None or a < b))
    return out


def explore_table(grid: list[dict[str, Any]]) -> list[str]:
    rows = ["| MIN_SLEEP ms | BATCH | idle metric p50 / p99 | idle e2e p50 / p99 | idle CPU "
            "broker / pg | burst drain timers/s | burst last lag (s) | lost / dup |",
            "|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for g in grid:
        idle, burst = g.get("idle") or {}, g.get("burst") or {}
        m, e = idle.get("metric_lag") or {}, idle.get("lag") or {}
        cpu = idle.get("cpu_cores") or {}
        lost = sum((x.get("delivery") or {}).get("lost") or 0 for x in (idle, burst))
        dup = sum((x.get("delivery") or {}).get("duplicates") or 0 for x in (idle, burst))
        rate = burst.get("drain_timers_per_s")
        rows.append(f"| {g['min_sleep_ms']} | {g['batch']} | {ms_cell(m.get('p50_ms'))} / "
                    f"{ms_cell(m.get('p99_ms'))} | {ms_cell(e.get('p50'))} / "
                    f"{ms_cell(e.get('p99'))} | {cpu.get('broker', '-')} / "
                    f"{cpu.get('postgres', '-')} | {f'{rate:,}' if rate else '-'} | "
                    f"{burst.get('last_timer_lag_s', '-')} | {lost} / {dup} |")
    return rows


def recommend(grid: list[dict[str, Any]]) -> list[str]:
    """MIN_SLEEP: lowest idle metric p99 averaged over the batches; BATCH: highest burst drain
    averaged over the MIN_SLEEPs. Differences under 10 % are within this VM's noise, so the
    current default (10 / 500) stays unless another value beats it by more."""
    def mean(values: list[Any]) -> float | None:
        values = [v for v in values if isinstance(v, int | float)]
        return sum(values) / len(values) if values else None

    by_sleep = {s: mean([((g.get("idle") or {}).get("metric_lag") or {}).get("p99_ms")
                         for g in grid if g["min_sleep_ms"] == s])
                for s in sorted({g["min_sleep_ms"] for g in grid})}
    by_batch = {b: mean([(g.get("burst") or {}).get("drain_timers_per_s")
                         for g in grid if g["batch"] == b])
                for b in sorted({g["batch"] for g in grid})}
    out = []
    sleeps = {k: v for k, v in by_sleep.items() if v is not None}
    if sleeps:
        best = min(sleeps, key=sleeps.__getitem__)
        pick = 10 if 10 in sleeps and sleeps[10] <= 1.1 * sleeps[best] else best
        out.append("- MIN_SLEEP: idle metric p99 averaged over the batch sizes: "
                   + ", ".join(f"{k} ms -> {v:.1f} ms" for k, v in sleeps.items())
                   + f"; data-picked value **{pick} ms**.")
    batches = {k: v for k, v in by_batch.items() if v is not None}
    if batches:
        best = max(batches, key=batches.__getitem__)
        pick = 500 if 500 in batches and batches[500] >= 0.9 * batches[best] else best
        out.append("- BATCH: burst drain averaged over the MIN_SLEEP values: "
                   + ", ".join(f"{k} -> {v:,.0f} timers/s" for k, v in batches.items())
                   + f"; data-picked value **{pick}**.")
    return out


def _trim(cdf: list[list[float]] | None) -> list[list[float]]:
    """Histogram buckets from the last empty one to the first full one (the rest is flat)."""
    if not cdf:
        return []
    first = max((i for i, (_, y) in enumerate(cdf) if y == 0), default=0)
    last = next((i for i, (_, y) in enumerate(cdf) if y >= 1), len(cdf) - 1)
    return cdf[first:last + 1]


# -- plots ------------------------------------------------------------------------------------


def plots(out_dir: Path, scenarios: dict[str, Any]) -> list[str]:
    """PNG files written (names relative to out_dir); none without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for unit in (*PEER_UNITS, "api-load", "cancel-race"):
        parties = scenarios.get(unit) or {}
        if not parties:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for party in PARTIES:
            cdf = ((parties.get(party) or {}).get("lag") or {}).get("cdf_ms")
            if cdf:
                ax.step([max(x, 0.01) for x, _ in cdf], [y for _, y in cdf], where="post",
                        label=LABELS[party])
        metric = _trim(((parties.get("ours") or {}).get("metric_lag") or {}).get("cdf_ms"))
        if metric:
            ax.step([x for x, _ in metric], [y for _, y in metric], where="post", linestyle="--",
                    label="queen-trio broker metric (fire commit)")
        ax.set_xscale("log")
        ax.set_xlabel("lag after the due instant (ms, log scale)")
        ax.set_ylabel("fraction of timers")
        ax.set_title(f"fire lag CDF: {unit}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        name = f"fire_lag_cdf_{unit}.png"
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=90)
        plt.close(fig)
        written.append(name)
    burst = scenarios.get("burst") or {}
    if burst:
        fig, ax = plt.subplots(figsize=(7, 4))
        for party in PARTIES:
            curve = (burst.get(party) or {}).get("drain_curve")
            if curve:
                ax.plot([t for t, _ in curve], [f for _, f in curve], label=DRAIN_LABELS[party])
        ax.set_xlabel("seconds after the due instant (= lag of the timer fired then)")
        ax.set_ylabel("fraction of the burst fired")
        ax.set_title("burst: timers fired over time (lag grows while the backlog drains)")
        ax.set_xscale("symlog", linthresh=1.0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        fig.savefig(out_dir / "fire_lag_burst.png", dpi=90)
        plt.close(fig)
        written.append("fire_lag_burst.png")
    return written


# -- publish ----------------------------------------------------------------------------------


def section(summary: dict[str, Any], images: list[str]) -> list[str]:
    info = summary.get("machine") or {}
    scenarios = summary.get("scenarios") or {}
    peer = summary.get("peer") or {}
    lines = [f"_Generated by `python -m bench.fire_lag` from `bench/results/fire_lag.json` "
             f"({summary.get('timestamp')}); do not edit by hand._", "",
             f"Machine: {info.get('platform')}, {info.get('cpu_count')} CPUs, Python "
             f"{info.get('python')}, {info.get('postgresql')} ({info.get('postgresql_server')}); "
             f"checkout {info.get('checkout')}; load average at the start of the last run "
             f"{info.get('load_avg_at_start')}. Peer: "
             + (f"Procrastinate {peer.get('version')}, profiles {json.dumps(peer.get('profiles'))}"
                if not peer.get("skipped") else f"skipped ({peer.get('skipped')})") + ".", "",
             "Commands of the runs shown: "
             + "; ".join(sorted({f"`{p.get('command')}`" for u in scenarios.values()
                                for p in u.values() if p.get("command")})) + ".", "",
             "Lag (ms) of every scheduled timer, as the user feels it: `ours` = the start of "
             "the handler run by `Client.consume(queue, handler)` at its defaults (asyncio, its "
             "own process) − deliverAt; `ours-sync` the same through `SyncClient.consume`; "
             "`ours-wire` (second column) = when a long-polling autoAck pop loop inside the "
             "bench received the answer; peer = job start − scheduled_at (its worker, its own "
             "process). \"> wait\" = not started before the scenario's wait ran out. The broker "
             "metric is fire commit − deliver_at (PostgreSQL's clock, histogram "
             "interpolation). CPU in cores busy (the consumer processes count as other).", ""]
    lines += lag_table(scenarios) + [""]
    ratios = ratio_table(scenarios)
    if len(ratios) > 2:
        lines += ["Ratios (higher = ours is faster):", ""] + ratios + [""]
    bursts = burst_table(scenarios)
    if len(bursts) > 2:
        lines += bursts + [""]
    lines += ours_only(scenarios) + [""]
    min_sleep = int((info.get("sweeper_env") or {}).get("QUEEN_SWEEPER_MIN_SLEEP_MS", 10))
    lines += ["Targets (issue 18):", ""] + targets(scenarios, min_sleep) + [""]
    lines += [f"![{name}](../bench/results/{name})" for name in images]
    return lines


def explore_section(explore: dict[str, Any]) -> list[str]:
    info = explore.get("machine") or {}
    sizes = explore.get("sizes") or {}
    return [f"_Generated by `{info.get('command')}` from `bench/results/fire_lag_explore.json` "
            f"({explore.get('timestamp')}, load average {info.get('load_avg_at_start')} at the "
            f"start); a fresh broker per row; idle = {sizes.get('explore_idle_timers')} timers, "
            f"burst = {sizes.get('explore_burst'):,} timers._", ""] \
        + explore_table(explore.get("grid") or []) + [""] + recommend(explore.get("grid") or [])


def replace_between(text: str, begin: str, end: str, body: list[str]) -> str:
    block = "\n".join([begin, *body, end])
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text)
    return text.rstrip("\n") + "\n\n" + block + "\n"


def publish(out_dir: Path, *, readme: bool, print_table: bool = True) -> None:
    summary = _load(out_dir / "fire_lag.json")
    explore = _load(out_dir / "fire_lag_explore.json")
    body = explore_body = None
    if summary:
        images = plots(out_dir, summary.get("scenarios") or {})
        body = section(summary, images)
        if print_table:
            print("\n".join(body))
    if explore:
        explore_body = explore_section(explore)
        print("\n".join(explore_body))
    if readme and out_dir.resolve() == RESULTS.resolve():
        text = README.read_text()
        if body:
            text = replace_between(text, BEGIN, END, body)
        if explore_body:
            text = replace_between(text, XBEGIN, XEND, explore_body)
        README.write_text(text)


def print_failures(failures: Any) -> None:
    if not failures.total():
        print("failures: none (every answer as expected; every timer of ours exactly once)")
        return
    failures.print_details(examples=20, width=600)
