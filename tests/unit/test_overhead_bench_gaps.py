"""``bench_overhead``'s steady-state gap rows: only the gaps after each wave's last first token count."""

from __future__ import annotations

import math

from devtools.overhead_bench import Stream, Wave, steady_gap_ratio


def _stream(first: float, gaps: list[tuple[float, float]]) -> Stream:
    """A stream whose first token came at ``first`` (s) and whose gaps are ``(ms, ended at s)``."""
    return Stream(
        first_token_at=first,
        gaps_ms=[g for g, _ in gaps],
        gap_ends=[e for _, e in gaps],
        tokens=1 + len(gaps),
    )


def test_gaps_that_end_before_the_last_first_token_are_left_out():
    early = _stream(0.0, [(300.0, 0.3), (50.0, 0.55), (40.0, 0.6)])  # the 300 ms gap is the burst's arrival
    late = _stream(0.5, [(45.0, 0.545)])
    wave = Wave([early, late], wall_s=1.0)
    assert sorted(wave.steady_gaps_ms()) == [40.0, 45.0, 50.0]
    assert Wave([Stream()], wall_s=1.0).steady_gaps_ms() == []  # no first token: nothing is steady


def test_the_ratio_compares_the_page_waves_steady_p99_with_the_bare_engines():
    page = Wave([_stream(0.0, [(500.0, 0.4), (60.0, 1.0)]), _stream(0.5, [(80.0, 1.1)])], wall_s=2.0)
    bare = Wave([_stream(0.0, [(40.0, 0.1)]), _stream(0.0, [(40.0, 0.2)])], wall_s=1.0)
    assert (
        steady_gap_ratio([page], [bare]) == 2.0
    )  # 80 / 40: the 500 ms gap ended before the last first token
    assert math.isnan(steady_gap_ratio([page], []))
