"""``devtools.bench.burst_probe``: one round with the default model prints a row per checkout with its bursts' time and
the thread counts their prefill steps ended on; bad options are refused."""

import pytest

from devtools.bench import burst_probe


def test_a_round_times_the_bursts_and_reports_their_prefill_steps_threads(capsys):
    row = burst_probe.measure(0, 3, 8, 1)
    assert row["ms"] > 0
    assert row["threads"] and all(n >= 1 for n in row["threads"])  # one entry per prefill step
    assert burst_probe.main(["--rounds", "1", "--bursts", "1", "--prompts", "2", "--length", "8"]) == 0
    out = capsys.readouterr().out
    assert "burst_probe: neighbour before, 1 rounds x 1 bursts of 2 prompts x 8 tokens" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("| . |")]
    assert float(line.split("|")[2].split()[0]) > 0


@pytest.mark.parametrize("option", ["--rounds", "--bursts", "--prompts", "--length"])
def test_counts_below_one_are_refused(option, capsys):
    with pytest.raises(SystemExit):
        burst_probe.main([option, "0"])
    assert f"{option} must be at least 1" in capsys.readouterr().err
