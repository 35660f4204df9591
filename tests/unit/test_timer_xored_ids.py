"""The message ids the broker derives for a bundle of new names (queen.schedule_timer_list's
short answer): the call's base id with each timer's position XORed into its last 64 bits, as
the function mints them (its SQL side: tests/integration/test_schedule_bundle_insert.py)."""

from __future__ import annotations

import uuid

import pytest

from queen_trio.timers.store import xored_ids


@pytest.mark.parametrize("n", [0, 1, 2, 500, 4095, 4096, 5000])
@pytest.mark.parametrize("base", ["01a24625-ce0c-79ec-b218-02fc8f3cfba0",
                                  "01a24625-ce0c-79ec-bfff-ffffffffffff",
                                  "01a24625-ce0c-79ec-8000-000000000000"])
def test_each_id_is_the_base_with_its_position_xored_into_the_last_64_bits(
    base: str, n: int
) -> None:
    value = uuid.UUID(base).int
    assert xored_ids(base, n) == [str(uuid.UUID(int=value ^ i)) for i in range(1, n + 1)]
