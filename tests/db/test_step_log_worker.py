"""A GPU worker's engine step log (``ENGINE_STEP_LOG``, ``inference.workerops.start_step_log``): one JSON line
per step of the worker's real engine (the tiny random-weight Llama), with the phases of the steps that
finished requests; a file the worker cannot open leaves it serving without one."""

import json
import logging

from inference import workerops
from inference.worker import WorkerHost
from tests.db.conftest import finished_streams


def test_a_worker_with_a_step_log_writes_every_step_of_its_engine(engine, settings, tmp_path):
    path = tmp_path / "steps.jsonl"
    settings.ENGINE_STEP_LOG = str(path)
    host = WorkerHost(engine)
    workerops.start_step_log(host)
    log = host.step_log
    try:
        workerops.start_step_log(host)  # once per host
        assert host.step_log is log
        finished_streams(engine, count=3, tokens=5)
    finally:
        engine.remove_step_listener(log)
        log.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sum(line["num_finished"] for line in lines) == 3
    decoded = sum(line["num_decode_tokens"] for line in lines)
    assert decoded == 3 * 4  # each request's first token comes from its prefill
    for line in lines:
        assert line["forward_s"] > 0 and line["forward_s"] + line["apply_s"] <= line["duration_s"]
        assert (line["finish_kv_s"] > 0) == (line["num_finished"] > 0)


def test_a_step_log_the_worker_cannot_open_is_an_error_in_its_log_and_nothing_more(
    engine, settings, tmp_path, caplog
):
    settings.ENGINE_STEP_LOG = str(tmp_path / "no-such-dir" / "steps.jsonl")
    host = WorkerHost(engine)
    with caplog.at_level(logging.ERROR, logger="inference.workerops"):
        workerops.start_step_log(host)
    assert host.step_log is None
    assert "cannot open ENGINE_STEP_LOG" in caplog.text
    finished_streams(engine, count=1, tokens=2)  # the engine still serves


def test_no_step_log_by_default(engine, settings):
    settings.ENGINE_STEP_LOG = ""
    host = WorkerHost(engine)
    workerops.start_step_log(host)
    assert host.step_log is None
