"""The embedded server's shared_buffers, sized from the machine's memory
(queen_trio.embedded.shared_buffers_mb; docs/timers-at-scale.md has why)."""

from __future__ import annotations

from pathlib import Path

from queen_trio.embedded import DEFAULT_SERVER_SETTINGS, available_memory, shared_buffers_mb

GIB = 2**30


def test_an_eighth_of_memory_between_postgresqls_default_and_1gb() -> None:
    assert shared_buffers_mb(512 * 2**20) == 128  # a small machine keeps the default
    assert shared_buffers_mb(2 * GIB) == 256
    assert shared_buffers_mb(4 * GIB) == 512
    assert shared_buffers_mb(8 * GIB) == 1024
    assert shared_buffers_mb(64 * GIB) == 1024


def test_the_embedded_server_runs_with_it() -> None:
    assert DEFAULT_SERVER_SETTINGS["shared_buffers"] == f"{shared_buffers_mb()}MB"


def test_a_containers_memory_limit_bounds_it(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    v2.write_text("1073741824\n")  # a container of 1 GiB on a larger machine
    assert available_memory((v2, v1)) == 2**30
    assert shared_buffers_mb(available_memory((v2, v1))) == 128
    v2.write_text("max\n")  # no limit: the machine's memory, as without the file
    assert available_memory((v2,)) == available_memory(())
    v1.write_text(str(4 * GIB))
    assert available_memory((tmp_path / "absent", v1)) == min(4 * GIB, available_memory(())
                                                              or 4 * GIB)
