"""``devtools.bench.decode_probe``'s neighbours: the duty-cycle one runs in a thread of the probe's process or in a
process of its own, busy about its share of the time, and ends when the probe stops it; bad options are refused."""

import argparse
import multiprocessing
import os
import threading
import time

import psutil
import pytest

from devtools.bench import decode_probe
from devtools.management.commands.bench_burst import cpu_s


def _args(**kw):
    base = {"neighbour": False, "duty": 0.0, "duty_in": "thread", "burst_ms": 0.5, "neighbour_cpu": None}
    return argparse.Namespace(**(base | kw))


def test_no_neighbour_by_default():
    stop, kind = decode_probe._start_neighbour(_args())
    assert kind == ""
    stop()


def test_a_thread_neighbour_is_busy_about_its_share_and_stops():
    before = {t.ident for t in threading.enumerate()}
    stop, kind = decode_probe._start_neighbour(_args(duty=0.5))
    assert kind == "thread at duty 0.5"
    (thread,) = [t for t in threading.enumerate() if t.ident not in before]
    start = time.process_time()
    time.sleep(0.4)  # this thread sleeps: the process's CPU meanwhile is the neighbour's (about 0.2 s)
    assert time.process_time() - start > 0.05
    stop()
    assert not thread.is_alive()
    start = time.process_time()
    time.sleep(0.2)
    assert time.process_time() - start < 0.05


def test_a_process_neighbour_runs_apart_and_is_terminated():
    stop, kind = decode_probe._start_neighbour(_args(duty=0.5, duty_in="process"))
    assert kind == "process at duty 0.5"
    (child,) = multiprocessing.active_children()
    time.sleep(0.5)  # past the spawned interpreter's start
    neighbour = [psutil.Process(child.pid)]
    start, own = cpu_s(neighbour), time.process_time()
    time.sleep(0.4)
    assert cpu_s(neighbour) - start > 0.05  # about 0.2 s, in the child
    assert time.process_time() - own < 0.05  # none of it in this process
    stop()
    assert not child.is_alive()
    assert child.exitcode is not None


def test_a_process_neighbour_can_be_held_to_one_cpu():
    cpu = max(os.sched_getaffinity(0))
    stop, kind = decode_probe._start_neighbour(_args(duty=0.5, duty_in="process", neighbour_cpu=cpu))
    assert kind == f"process at duty 0.5 on CPU {cpu}"
    (child,) = multiprocessing.active_children()
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).cpu_affinity() != [cpu] and time.monotonic() < deadline:
        time.sleep(0.05)  # the spawned interpreter sets it once it runs the target
    assert psutil.Process(child.pid).cpu_affinity() == [cpu]
    stop()
    assert not child.is_alive()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["2", "1", "--duty", "1.0"], "--duty must be in [0, 1)"),
        (["2", "1", "--duty", "0.2", "--burst-ms", "0"], "--duty must be in [0, 1)"),
        (["2", "1", "--duty", "0.2", "--neighbour"], "--neighbour or --duty, not both"),
        (["2", "1", "--duty", "0.2", "--neighbour-cpu", "0"], "give --duty D --duty-in process"),
        (
            ["2", "1", "--duty", "0.2", "--duty-in", "process", "--neighbour-cpu", "4096"],
            "not a CPU this process",
        ),
    ],
)
def test_bad_duty_options_are_refused_before_the_model_loads(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        decode_probe.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
