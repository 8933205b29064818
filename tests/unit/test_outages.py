import pytest
from django.db import IntegrityError, OperationalError

from database.outages import with_db_retry


class FakeTime:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def failing(times, result="written", error=OperationalError):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= times:
            raise error("server closed the connection unexpectedly")
        return result

    return fn, calls


def test_write_is_retried_with_backoff_until_the_database_returns():
    t = FakeTime()
    fn, calls = failing(5)
    assert with_db_retry(fn, window_s=60, sleep=t.sleep, clock=t.clock) == "written"
    assert len(calls) == 6 and t.sleeps == [0.25, 0.5, 1.0, 2.0, 4.0]


def test_gives_up_after_the_window_with_the_last_error():
    t = FakeTime()
    fn, calls = failing(1000)
    with pytest.raises(OperationalError):
        with_db_retry(fn, window_s=10, sleep=t.sleep, clock=t.clock)
    assert sum(t.sleeps) <= 10 and len(calls) >= 4


def test_other_database_errors_are_not_retried():
    t = FakeTime()
    fn, calls = failing(1, error=IntegrityError)
    with pytest.raises(IntegrityError):
        with_db_retry(fn, window_s=10, sleep=t.sleep, clock=t.clock)
    assert len(calls) == 1 and t.sleeps == []
