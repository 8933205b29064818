"""CPU-contention defaults: the adaptive intra-op thread count and the contention monitor it reads."""

from __future__ import annotations

import subprocess
import sys
import time

from inference.engine.threads import AdaptiveThreads, CpuShareMonitor, default_num_threads


class _Script:
    """Stands in for /proc readings: returns scripted "cores used by other processes"."""

    def __init__(self, values):
        self.values = list(values)
        self.last_window_s = 0.5

    def sample(self):
        return self.values.pop(0)


def _policy(max_threads, samples, calm_windows=1):
    policy = AdaptiveThreads(max_threads, interval_s=0.0, calm_windows=calm_windows)
    policy._monitor = _Script(samples)
    return policy


def test_target_leaves_the_cores_other_processes_use():
    policy = AdaptiveThreads(4)
    assert [policy.target(x) for x in (0.0, 0.4, 0.6, 1.0, 2.2, 3.9, 9.0)] == [4, 4, 3, 3, 2, 1, 1]


def test_steps_down_at_once_and_up_after_one_calm_window_by_default():
    # Lever 43: a burst beside the engine (a web process admitting sends) costs it one thread for one window
    # after the burst, not two.
    default = AdaptiveThreads(2)
    assert (default.interval_s, default.calm_windows) == (0.25, 1)
    policy = _policy(2, [0.1, 1.0, 0.9, 0.1, 0.0, 1.0])
    got = [policy.poll() for _ in range(6)]
    assert got == [None, 1, None, 2, None, 1]
    assert policy.current == 1 and policy.changes == 3


def test_steps_up_only_after_calm_windows_in_a_row():
    policy = _policy(2, [0.1, 1.0, 0.1, 0.9, 0.0, 0.0, 0.0], calm_windows=2)
    got = [policy.poll() for _ in range(7)]
    assert got == [None, 1, None, None, None, 2, None]
    assert policy.current == 2 and policy.changes == 2


def test_resume_judges_the_latest_idle_window_not_the_whole_idle_spell():
    # A neighbour's burst early in the idle spell (1.5 cores) is forgotten by the next idle tick (calm); resume's
    # own window is calm too, so the engine keeps both threads.
    policy = _policy(2, [1.5, 0.1, 0.0, 1.2])
    policy.idle_tick()
    policy.idle_tick()
    assert policy.resume() is None and policy.current == 2
    assert policy.poll() == 1  # a neighbour that starts later is seen at the next window as before


def test_resume_leaves_a_busy_neighbour_its_core_before_the_first_step():
    # The neighbour is busy now: the first step (a prefill) must not run at all threads, where every OpenMP barrier
    # waits for the descheduled thread.
    policy = _policy(2, [1.0, 1.0])
    policy.idle_tick()
    assert policy.resume() == 1 and policy.current == 1


def test_resume_falls_back_to_the_last_idle_window_when_its_own_is_too_short():
    policy = _policy(2, [1.0, 0.0])
    policy.idle_tick()
    policy._monitor.last_window_s = AdaptiveThreads.MIN_WINDOW_S / 2  # resume() came right after the tick
    assert policy.resume() == 1  # the idle window's reading (busy), not the 50 ms one (calm)


def test_resuming_after_idle_starts_again_with_all_threads_once_the_neighbour_is_gone():
    # Stepped down before the idle spell: without the reset the next burst's prefill would run on one thread
    # for two more windows even though the neighbour has gone.
    policy = _policy(2, [1.0, 0.0, 0.0, 0.0, 1.1])
    assert policy.poll() == 1
    policy.idle_tick()
    assert policy.resume() == 2 and policy.current == 2
    assert policy.poll() is None  # calm window: stays at 2
    assert policy.poll() == 1  # the neighbour is back: down at once


def test_default_threads_follow_the_affinity_mask():
    import os

    assert default_num_threads() == len(os.sched_getaffinity(0))


def test_monitor_sees_a_cpu_bound_neighbour():
    monitor = CpuShareMonitor()
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        monitor.sample()
        time.sleep(1.0)
        other = monitor.sample()
    finally:
        neighbour.kill()
        neighbour.wait()
    assert other is not None and other >= 0.5  # the neighbour alone is ~1 core (others only add)


def test_a_long_step_is_judged_between_its_layers_on_short_windows():
    # Lever 63: a burst's prefill that started on one thread steps up once a calm MIN_WINDOW_S of it has passed,
    # instead of running the whole step (0.3 s) on the thread the burst left it.
    policy = AdaptiveThreads(2)
    policy._monitor = _Script([1.0, 1.0, 0.1, 1.2])
    policy.idle_tick()
    assert policy.resume() == 1
    policy.step_started()
    assert policy.poll_within_step() is None  # the step has not run MIN_WINDOW_S yet: no sample taken
    assert policy._monitor.values == [0.1, 1.2]
    policy._step_started -= AdaptiveThreads.MIN_WINDOW_S
    policy._last_judged -= AdaptiveThreads.MIN_WINDOW_S
    assert policy.poll_within_step() == 2 and policy.current == 2  # calm window: up at once
    assert policy.poll_within_step() is None  # judged MIN_WINDOW_S ago at the latest: not again yet
    policy._last_judged -= AdaptiveThreads.MIN_WINDOW_S
    assert policy.poll_within_step() == 1  # a neighbour that wakes mid-step gets its core back at once
    assert policy.poll() is None  # the step's end does not judge the short window since again


def test_decode_steps_shorter_than_the_window_never_sample_within_the_step():
    policy = AdaptiveThreads(2)
    policy._monitor = _Script([])  # any sample would fail
    for _ in range(50):
        policy.step_started()
        assert policy.poll_within_step() is None
    assert policy.changes == 0
