"""inference/fleet.py: DecodeRate, the decode rate a worker publishes (and admission learns an engine's
capacity from): over the last seconds of work, not diluted by the idle seconds before a burst."""

import pytest

from inference.fleet import DecodeRate


def test_the_rate_after_an_idle_spell_counts_only_the_time_since_the_engine_was_last_seen_idle():
    rate = DecodeRate(window_s=5.0)
    for second in range(5):  # idle for 4 s: the counter stands still
        assert rate.observe(100.0 + second, 1000, idle=True) == 0.0
    # a burst arrives: 1 s later 100 tokens were decoded while requests wait
    assert rate.observe(105.0, 1100, idle=False) == pytest.approx(100.0)  # not 100 tokens / 5 s = 20
    assert rate.observe(106.0, 1200, idle=False) == pytest.approx(100.0)


def test_a_busy_engine_reads_over_the_last_window_s_only():
    rate = DecodeRate(window_s=5.0)
    total = 0
    for second in range(12):
        total += 400 if second < 6 else 100  # fast at first, then 100 tokens/s
        last = rate.observe(float(second), total, idle=False)
    assert last == pytest.approx(100.0)  # samples older than 5 s are dropped


def test_the_first_sample_reads_zero():
    assert DecodeRate().observe(10.0, 500, idle=False) == 0.0
