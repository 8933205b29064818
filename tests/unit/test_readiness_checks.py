"""operations/health.py: BackgroundCheck, the readiness check that answers from its last look and refreshes
off the probe's path (so a slow broker link cannot make every web node miss the balancer's checks)."""

import threading

from operations.health import BackgroundCheck


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class BlockingProbe:
    """A probe that records the thread of each look and, once ``hold`` is cleared, blocks until released."""

    def __init__(self, result=None) -> None:
        self.result = result
        self.threads: list[str] = []
        self.hold = threading.Event()
        self.hold.set()
        self.started = threading.Event()

    def __call__(self):
        self.threads.append(threading.current_thread().name)
        self.started.set()
        assert self.hold.wait(10)
        return self.result


def answer_within(check, seconds: float = 5.0):
    """``check()``'s answer, failing the test if it does not come within ``seconds`` (a blocked probe)."""
    box = []
    thread = threading.Thread(target=lambda: box.append(check()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, "the check waited on its probe"
    return box[0]


def test_the_first_look_is_inline_and_later_ones_reuse_it_until_it_is_old():
    probe, clock = BlockingProbe(), Clock()
    check = BackgroundCheck(probe, recheck_s=5, stale_s=20, clock=clock)
    assert check() is None and probe.threads == [threading.current_thread().name]
    clock.now += 4
    assert check() is None and len(probe.threads) == 1


def test_an_old_result_is_refreshed_on_another_thread_while_the_probe_answers_at_once():
    probe, clock = BlockingProbe(), Clock()
    check = BackgroundCheck(probe, recheck_s=5, stale_s=20, clock=clock)
    check()
    probe.hold.clear()  # the next look hangs like a broker 100 ms away with lost packets
    probe.started.clear()
    probe.result = "broker unreachable (OperationalError)"
    clock.now += 6
    assert answer_within(check) is None  # the last result, at once
    assert probe.started.wait(5) and probe.threads[-1] == "readiness-refresh"
    assert answer_within(check) is None and len(probe.threads) == 2  # one refresh in flight, not one per call
    probe.hold.set()
    for _ in range(100):
        if check() is not None:
            break
        threading.Event().wait(0.05)
    assert check() == "broker unreachable (OperationalError)"


def test_a_refresh_that_never_answers_fails_the_check_once_the_result_is_stale():
    probe, clock = BlockingProbe(), Clock()
    check = BackgroundCheck(probe, recheck_s=5, stale_s=20, clock=clock)
    check()
    probe.hold.clear()
    clock.now += 6
    answer_within(check)
    clock.now += 15  # 21 s since the last answer
    assert answer_within(check) == "no answer for 21 s"
    probe.hold.set()


def test_a_probe_that_raises_reads_as_a_failing_check_and_forget_looks_again():
    calls = []

    def probe():
        calls.append(1)
        raise ValueError("bug")

    check = BackgroundCheck(probe, recheck_s=5, stale_s=20, clock=Clock())
    assert check() == "check failed (ValueError)"
    check.forget()
    assert check() == "check failed (ValueError)" and len(calls) == 2
