"""The engine's step log (``ENGINE_STEP_LOG``, observability/step_log.py) and its summary
(``python -m devtools.bench.step_log``): what a worker writes per step and how the summary splits it."""

from __future__ import annotations

import json

import pytest

from devtools.bench import step_log as summary
from inference.engine import StepStats
from observability.step_log import FIELDS, StepLog


def _stats(*, finished=0, batch=32, prefill=0, duration=0.040, forward=0.030, apply=0.008, kv=0.0):
    return StepStats(
        started_at=100.0,
        duration_s=duration,
        num_running=batch - finished,
        num_waiting=0,
        batch_size=batch,
        num_prefill_tokens=prefill,
        num_decode_tokens=batch,
        num_sampled_tokens=batch,
        num_finished=finished,
        num_prefix_cache_hit_tokens=0,
        kv_used_tokens=0,
        kv_total_tokens=65536,
        num_threads=2,
        forward_s=forward,
        apply_s=apply,
        apply_cpu_s=apply / 2,
        finish_kv_s=kv,
        finish_kv_cpu_s=kv / 3,
    )


def test_step_log_writes_one_json_line_per_step_with_the_phase_fields(tmp_path):
    path = tmp_path / "steps.jsonl"
    log = StepLog(str(path))
    log(_stats())
    log(_stats(finished=20, duration=0.200, apply=0.150, kv=0.100))
    log.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [set(line) for line in lines] == [set(FIELDS)] * 2
    assert lines[1]["num_finished"] == 20 and lines[1]["finish_kv_s"] == pytest.approx(0.100)
    log(_stats())  # after close: quiet, nothing written and nothing raised
    assert len(path.read_text().splitlines()) == 2


def test_step_log_refuses_a_path_it_cannot_open(tmp_path):
    with pytest.raises(OSError):
        StepLog(str(tmp_path / "no-such-dir" / "steps.jsonl"))


def test_summary_splits_steady_decode_from_finishing_steps(tmp_path, capsys):
    path = tmp_path / "steps.jsonl"
    log = StepLog(str(path))
    for _ in range(5):
        log(_stats(duration=0.040))
    log(_stats(prefill=300, duration=0.300))  # a prefill step: neither kind
    log(_stats(batch=8, duration=0.020))  # a small batch: not the steady decode
    log(_stats(finished=20, duration=0.200, apply=0.150, kv=0.100))
    log(_stats(finished=5, duration=0.060, apply=0.020, kv=0.010))  # too few finishes
    log.close()
    with open(path, "a") as f:
        f.write('{"started_at": 1.0, "durat')  # a worker killed mid-line
    steps = summary.load(str(path))
    assert len(steps) == 9
    parts = summary.summarise(steps, min_finishes=10, min_batch=28)
    assert len(parts["decode"]) == 5 and [s["num_finished"] for s in parts["finishing"]] == [20]
    assert summary.main([str(path), "--steps"]) == 0
    out = capsys.readouterr().out
    assert "5 decode steps of >= 28 requests, 1 steps finishing >= 10 requests" in out
    assert "| steady decode | 40.0 [40.0-40.0] | 30.0 [30.0-30.0] |" in out
    assert (
        "| finishing | 200.0 [200.0-200.0] | 30.0 [30.0-30.0] | 150.0 [150.0-150.0] | 75.0 [75.0-75.0] |"
        in out
    )
    assert (
        "per finish, in the finishing steps: wall 5.0 [5.0-5.0] ms, loop thread CPU 1.7 [1.7-1.7] ms" in out
    )
    assert "| 200.0 | 20 | 30.0 | 150.0 / 75.0 | 100.0 / 33.3 |" in out
    # The step time by kind: every step counted once; 200 + 300 + 5 x 40 + (20 + 60) = 780 ms.
    assert summary.time_by_kind(steps) == [
        ("finishing", 1, pytest.approx(0.200)),
        ("prefill", 1, pytest.approx(0.300)),
        ("steady decode", 5, pytest.approx(0.200)),
        ("other", 2, pytest.approx(0.080)),
    ]
    assert "| finishing | 1 | 200 | 26% |" in out and "| prefill | 1 | 300 | 38% |" in out
    assert "| steady decode | 5 | 200 | 26% |" in out and "| other | 2 | 80 | 10% |" in out


def test_summary_errors_are_clear(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        summary.main([str(tmp_path / "missing.jsonl")])
    assert exc.value.code == 2 and "cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        summary.main([str(tmp_path / "missing.jsonl"), "--min-finishes", "0"])
    assert exc.value.code == 2 and "must be at least 1" in capsys.readouterr().err
