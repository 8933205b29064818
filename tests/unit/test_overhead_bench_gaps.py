"""``bench_overhead``'s steady-state gap rows: only the gaps after each wave's last first token count."""

from __future__ import annotations

import math

from devtools.overhead_bench import Stream, Wave, steady_gap_ratio


def _stream(first: float, gaps: list[float]) -> Stream:
    """A stream whose first token came at ``first`` (s), then one token after each of ``gaps`` (ms)."""
    return Stream(first_token_at=first, gaps_ms=gaps, tokens=1 + len(gaps))


def test_gaps_that_end_before_the_last_first_token_are_left_out():
    # Gaps ending at 0.3, 0.35 and 0.39 s; the 300 ms one is the burst's arrival.
    early = _stream(0.0, [300.0, 50.0, 40.0])
    late = _stream(0.32, [45.0])  # ends at 0.365 s
    wave = Wave([early, late], wall_s=1.0)
    assert sorted(wave.steady_gaps_ms()) == [40.0, 45.0, 50.0]
    assert Wave([Stream()], wall_s=1.0).steady_gaps_ms() == []  # no first token: nothing is steady


def test_the_ratio_compares_the_page_waves_steady_p99_with_the_bare_engines():
    page = Wave([_stream(0.0, [500.0, 60.0]), _stream(0.52, [80.0])], wall_s=2.0)
    bare = Wave([_stream(0.0, [40.0]), _stream(0.0, [40.0])], wall_s=1.0)
    assert (
        steady_gap_ratio([page], [bare]) == 2.0
    )  # 80 / 40: the 500 ms gap ended before the last first token
    assert math.isnan(steady_gap_ratio([page], []))
