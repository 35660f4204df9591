"""The SDK's duration grammar: what converts to delayMs / ttlSeconds and what is refused."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from queen_trio.client.durations import (
    UNIT_MS,
    delay_ms,
    format_ms,
    span_ms,
    ttl_seconds,
    whole_seconds,
)

UNITS = list(UNIT_MS)


@pytest.mark.parametrize(("text", "ms"), [
    ("250ms", 250), ("30s", 30_000), ("30m", 1_800_000), ("72h", 259_200_000),
    ("7d", 604_800_000), ("1h30m", 5_400_000), ("1d2h3m4s5ms", 93_784_005), ("0s", 0),
    ("-250ms", -250), ("90m", 5_400_000), ("1m500ms", 60_500),
])
def test_strings(text: str, ms: int) -> None:
    assert delay_ms(text) == ms


@pytest.mark.parametrize(("value", "ms"), [
    (250, 250), (0, 0), (-5, -5), (timedelta(minutes=15), 900_000),
    (timedelta(milliseconds=-250), -250), (timedelta(days=1, microseconds=1000), 86_400_001),
])
def test_ints_are_milliseconds_and_timedeltas_convert(value: int | timedelta, ms: int) -> None:
    assert delay_ms(value) == ms


@pytest.mark.parametrize("bad", [
    "", "30", "1.5h", "30min", "1H", "h", "ms", " 30s", "30s ", "30 s", "1m1h", "1h1h",
    "1s1m", "5ms1s", "--1s", "+1s", "1e3ms", "1h-30m", "١s",
])
def test_malformed_strings_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        delay_ms(bad)


@pytest.mark.parametrize("bad", [1.5, True, None, [250], b"30s", timedelta(microseconds=1)])
def test_other_types_and_sub_millisecond_precision_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        delay_ms(bad)  # type: ignore[arg-type]


def test_the_error_names_the_argument() -> None:
    with pytest.raises(ValueError, match="^wait 'soon' is not a duration"):
        delay_ms("soon", "wait")


# -- the grammar, generatively -----------------------------------------------------------------


@st.composite
def compounds(draw: st.DrawFn) -> tuple[str, int]:
    """A well-formed compound: distinct units, largest first, with the value it stands for."""
    units = sorted(draw(st.sets(st.sampled_from(UNITS), min_size=1)), key=UNITS.index)
    counts = [draw(st.integers(0, 10**6)) for _ in units]
    negative = draw(st.booleans())
    text = ("-" if negative else "") + "".join(f"{n}{u}" for n, u in zip(counts, units,
                                                                          strict=True))
    total = sum(n * UNIT_MS[u] for n, u in zip(counts, units, strict=True))
    return text, -total if negative else total


@given(compounds())
def test_every_well_formed_compound_converts_to_its_value(case: tuple[str, int]) -> None:
    text, ms = case
    assert delay_ms(text) == ms


@given(st.integers(-(10**13), 10**13))
def test_format_round_trips(ms: int) -> None:
    text = format_ms(ms)
    assert delay_ms(text) == ms
    assert delay_ms(timedelta(milliseconds=ms)) == ms


@given(st.lists(st.sampled_from(UNITS), min_size=2, max_size=5), st.data())
def test_units_out_of_order_or_repeated_are_refused(units: list[str], data: st.DataObject) -> None:
    ranks = [UNITS.index(u) for u in units]
    assume(any(a >= b for a, b in zip(ranks, ranks[1:], strict=False)))
    text = "".join(f"{data.draw(st.integers(0, 99))}{u}" for u in units)
    with pytest.raises(ValueError, match="largest to smallest"):
        delay_ms(text)


@given(st.text(alphabet="0123456789dhmsx .-+:", max_size=12))
def test_arbitrary_text_either_parses_or_raises_value_error(text: str) -> None:
    try:
        ms = delay_ms(text)
    except ValueError:
        return
    assert isinstance(ms, int) and format_ms(ms) and delay_ms(format_ms(ms)) == ms


# -- TTLs: the seconds side --------------------------------------------------------------------


@pytest.mark.parametrize(("value", "seconds"), [
    (1, 1), (86400, 86400), (timedelta(hours=1), 3600), ("1h", 3600), ("1m30s", 90),
    ("2000ms", 2),
])
def test_ttls_are_whole_seconds(value: int | timedelta | str, seconds: int) -> None:
    assert ttl_seconds(value) == seconds


@pytest.mark.parametrize("bad", [0, -1, "0s", "1500ms", timedelta(milliseconds=1500), 1.5,
                                 "soon", True])
def test_ttls_below_a_second_or_fractional_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        ttl_seconds(bad)  # type: ignore[arg-type]


def test_an_int_ttl_counts_seconds_not_milliseconds() -> None:
    assert ttl_seconds(30) == 30 and delay_ms(30) == 30
    assert whole_seconds(0, "delayedProcessing") == 0


# -- negative only where the wire allows it ---------------------------------------------------


def test_a_timer_delay_may_be_negative_as_on_the_wire() -> None:
    from queen_trio.client.builders import TimerBuilder

    assert delay_ms("-5s") == -5000 and delay_ms(timedelta(seconds=-5)) == -5000
    builder: TimerBuilder[object] = TimerBuilder(None, "q").delay("-5s")  # type: ignore[arg-type]
    assert builder._delay_ms == -5000  # a delay in the past: fires on the first sweep


@pytest.mark.parametrize("bad", [-1, "-5s", timedelta(seconds=-1)])
def test_other_durations_refuse_negative_values(bad: object) -> None:
    with pytest.raises(ValueError, match="wait must not be negative"):
        span_ms(bad, "wait")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 0"):
        whole_seconds(bad, "leaseTime")  # type: ignore[arg-type]
    assert span_ms(0, "wait") == 0 and span_ms("250ms", "wait") == 250


def test_a_negative_wait_is_refused_before_any_request() -> None:
    from queen_trio.client.calls import _pop_params

    with pytest.raises(ValueError, match="wait must not be negative"):
        _pop_params(None, 1, "-5s", False)
