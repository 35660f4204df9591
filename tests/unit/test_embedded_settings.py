"""The embedded server's shared_buffers, sized from the machine's memory
(queen_trio.embedded.shared_buffers_mb; docs/timers-at-scale.md has why)."""

from __future__ import annotations

from queen_trio.embedded import DEFAULT_SERVER_SETTINGS, shared_buffers_mb

GIB = 2**30


def test_an_eighth_of_memory_between_postgresqls_default_and_1gb() -> None:
    assert shared_buffers_mb(512 * 2**20) == 128  # a small machine keeps the default
    assert shared_buffers_mb(2 * GIB) == 256
    assert shared_buffers_mb(4 * GIB) == 512
    assert shared_buffers_mb(8 * GIB) == 1024
    assert shared_buffers_mb(64 * GIB) == 1024


def test_the_embedded_server_runs_with_it() -> None:
    assert DEFAULT_SERVER_SETTINGS["shared_buffers"] == f"{shared_buffers_mb()}MB"
