"""CPU seconds per party (this client, the service under test, PostgreSQL, the rest of the
machine), read from /proc, and the "client/broker/pg/other" cell the reports print."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar


class CpuMeter:
    """CPU seconds used by this client, the broker process and its descendants (the embedded
    PostgreSQL), and by everything else on the machine ("other": a concurrent test run skews
    the numbers), read from /proc. Without a broker pid (``--url``) only the client is known."""

    TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    PARTIES = ("client", "broker", "postgres", "other")

    def __init__(self, broker_pid: int | None) -> None:
        self.broker_pid = broker_pid

    def snapshot(self) -> dict[str, float]:
        snap = {"client": time.process_time()}
        if self.broker_pid is None or not Path("/proc").is_dir():
            return snap
        busy = machine_busy_ticks()
        stats = proc_stats()
        children = children_of(stats)
        below = tree_ticks(stats, children, children.get(self.broker_pid, []))
        snap["broker"] = stats.get(self.broker_pid, (0, 0.0, 0.0))[1] / self.TICK
        snap["postgres"] = below / self.TICK
        snap["other"] = busy / self.TICK - snap["client"] - snap["broker"] - snap["postgres"]
        return snap

    @staticmethod
    def cores(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, float]:
        """Average cores busy per party over ``wall_s``."""
        return {k: round((after[k] - before[k]) / wall_s, 2) for k in before if wall_s > 0}


def machine_busy_ticks() -> float:
    """CPU ticks this machine spent running something since boot (first line of /proc/stat):
    not idle, not waiting for I/O, and not stolen. Steal is time the hypervisor ran another
    guest while this one wanted the CPU: in a steady run it came and went at 0-90 ms a
    second, and counted as busy it showed as "other" work of whichever party was running."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, _steal = fields
    return float(user + nice + system + irq + softirq)


def proc_stats() -> dict[int, tuple[int, float, float]]:
    """pid -> (ppid, own utime + stime, reaped children's cutime + cstime), in ticks, for
    every readable process: a consistent reading. /proc is read one process at a time, and a
    child that exits and is reaped while the walk goes on either is read by neither (its
    parent, a lower pid, was read before the reap, and the child is gone by its turn) or is
    read twice (alive, then in its parent's reaped total): a whole backend's CPU lost or
    counted twice, and a PostgreSQL server's figure went down between two snapshots. So the
    reaped totals are read again after the walk, and the walk is made again if one has
    changed (a few times at most)."""
    stats = _read_stats()
    for _ in range(5):
        # (Every process, not only those with children now: one may have just reaped its
        # last.)
        if all(_reaped(pid) in (None, stat[2]) for pid, stat in stats.items()):
            break
        stats = _read_stats()
    return stats


def _read_stats() -> dict[int, tuple[int, float, float]]:
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                stats[int(entry.name)] = stat
    return stats


def _reaped(pid: int) -> float | None:
    stat = _stat(pid)
    return None if stat is None else stat[2]


def _stat(pid: int) -> tuple[int, float, float] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    own, reaped = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    return int(fields[1]), float(own), float(reaped)


def children_of(stats: dict[int, tuple[int, float, float]]) -> dict[int, list[int]]:
    """ppid -> its children's pids, from ``proc_stats()``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in stats.items():
        children.setdefault(ppid, []).append(pid)
    return children


def tree_ticks(stats: dict[int, tuple[int, float, float]], children: dict[int, list[int]],
               roots: list[int]) -> float:
    """CPU ticks of ``roots`` and all their descendants, each with its reaped children's
    (PostgreSQL backends that have exited)."""
    total, stack = 0.0, list(roots)
    while stack:
        p = stack.pop()
        if p in stats:
            total += stats[p][1] + stats[p][2]  # own + reaped
        stack.extend(children.get(p, []))
    return total


def cpu_cell(cores: dict[str, float]) -> str:
    """Cores busy as client/broker/postgres/other."""
    return "/".join(f"{cores[k]:.2f}" if k in cores else "-" for k in CpuMeter.PARTIES)


class PartyCpu:
    """CPU seconds of this client, the service processes under test (brokers, or the peer's
    worker; key "broker" so ``cpu_cell`` prints it), the shared PostgreSQL server (postmaster
    and every backend, exited ones included) and the rest of the machine."""

    TICK = CpuMeter.TICK

    def __init__(self, service_pids: list[int], postmaster_pid: int | None) -> None:
        self.service_pids = service_pids
        self.postmaster_pid = postmaster_pid

    def snapshot(self) -> dict[str, float]:
        snap = {"client": time.process_time()}
        if not Path("/proc").is_dir():
            return snap
        busy = machine_busy_ticks()
        stats = proc_stats()
        children = children_of(stats)

        def tree(pid: int) -> float:
            return tree_ticks(stats, children, [pid]) / self.TICK

        snap["broker"] = sum(tree(p) for p in self.service_pids)
        snap["postgres"] = tree(self.postmaster_pid) if self.postmaster_pid else 0.0
        snap["other"] = busy / self.TICK - snap["client"] - snap["broker"] - snap["postgres"]
        return snap

    cores = staticmethod(CpuMeter.cores)


def process_alive(pid: int) -> bool:
    """False once the process has exited (gone, or a zombie not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


class TreeCpu:
    """CPU seconds of named parties, each a list of process trees (a pid with its
    descendants, exited ones included: a PostgreSQL postmaster covers every backend), of this
    client, and of the rest of the machine ("other")."""

    TICK = CpuMeter.TICK
    #: Called at every snapshot, before it is taken (bench.harness.pg_statements watches the
    #: database over the same window).
    observers: ClassVar[list[Callable[[], None]]] = []

    def __init__(self, parties: dict[str, list[int]]) -> None:
        self.parties = parties

    def snapshot(self) -> dict[str, float]:
        for observe in self.observers:
            observe()
        snap = {"client": time.process_time()}
        if not Path("/proc").is_dir():
            return snap
        busy = machine_busy_ticks()
        stats = proc_stats()
        children = children_of(stats)
        for name, pids in self.parties.items():
            snap[name] = tree_ticks(stats, children, pids) / self.TICK
        snap["other"] = busy / self.TICK - sum(snap.values())
        return snap

    @staticmethod
    def seconds(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        """CPU seconds per party between two snapshots."""
        return {k: after[k] - before[k] for k in before if k in after}
