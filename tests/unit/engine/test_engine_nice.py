"""The engine's loop thread and the OpenMP workers it starts run at ``EngineConfig.nice``; the threads that
submit work (a Celery worker's task threads) keep their own priority (docs/overhead.md, refusals under load)."""

from __future__ import annotations

import os
import threading

import pytest

from inference.engine import EngineConfig, SamplingParams


def _threads() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _nice(tid: int) -> int | None:
    try:
        with open(f"/proc/self/task/{tid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:  # the thread exited meanwhile
        return None
    return int(fields[16])  # field 19 of stat(5): nice


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux only")
def test_engine_loop_and_its_openmp_workers_run_niced_while_the_submitter_does_not(make_engine, tokenizer):
    submitter = threading.get_native_id()
    own_nice = _nice(submitter)
    engine = make_engine(nice=7, num_threads=2, adaptive_threads=False)
    # Encoded first: the tokenizer starts its own thread pool from this thread, as the construction above ran
    # torch (and its OpenMP pool) here; neither is the engine's.
    prompt = tokenizer.encode("the engine runs at a lower priority than the web " * 4)
    before = _threads()
    engine.start()
    result = engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=6)).result(timeout=60)
    assert result.finish_reason in ("length", "stop")

    started = {tid: _nice(tid) for tid in _threads() - before}
    started = {tid: nice for tid, nice in started.items() if nice is not None}
    assert started[engine._thread.native_id] == 7
    # Every thread started since (the loop thread, then the OpenMP pools it created for 2 threads) inherited it.
    assert set(started.values()) == {7}
    if len(os.sched_getaffinity(0)) >= 2:
        assert len(started) >= 2, "no OpenMP worker was started by the loop thread"
    assert _nice(submitter) == own_nice


def test_nice_zero_leaves_the_loop_thread_alone_and_out_of_range_is_refused(make_engine, tokenizer):
    engine = make_engine(nice=0, num_threads=1, adaptive_threads=False)
    engine.start()
    engine.submit(tokenizer.encode("hello"), SamplingParams(max_new_tokens=2)).result(timeout=60)
    assert _nice(engine._thread.native_id) == _nice(threading.get_native_id())
    with pytest.raises(ValueError, match="nice"):
        EngineConfig(nice=20)
    with pytest.raises(ValueError, match="nice"):
        EngineConfig(nice=-1)
