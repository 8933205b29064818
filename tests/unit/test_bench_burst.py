"""``manage.py bench_burst``'s measuring helpers: the web process found by its listening port, and CPU time
counted over every thread of a process."""

import os
import socket
import threading
import time

import psutil
import pytest
from django.core.management.base import CommandError

from devtools.management.commands.bench_burst import cpu_s, listening_pid


def test_the_listening_process_is_found_by_its_port():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert listening_pid(port) == os.getpid()
    with pytest.raises(CommandError, match=f"no process listens on port {port}"):
        listening_pid(port)


def test_cpu_time_counts_the_work_of_other_threads():
    me = psutil.Process()

    def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    spun, done = threading.Event(), threading.Event()

    def pool_thread() -> None:  # as a server's pool thread: alive before and after its work
        spin(0.2)
        spun.set()
        done.wait(10)

    before = cpu_s([me])
    worker = threading.Thread(target=pool_thread)
    worker.start()
    spun.wait(10)
    spent = cpu_s([me]) - before
    done.set()
    worker.join()
    assert 0.18 <= spent < 1.0
    # Finer than the 10 ms clock ticks of user + system time: a few milliseconds show.
    before = cpu_s([me])
    spin(0.004)
    assert 0.003 <= cpu_s([me]) - before < 0.5


def test_a_thread_that_ends_mid_reading_counts_nothing_and_the_total_does_not_jump(monkeypatch):
    # A thread that ran 0.3 s and ended: the process's tick total holds it, the live threads' schedstat not.
    ended = threading.Thread(target=_spin_thread_time, args=(0.3,))
    ended.start()
    ended.join()
    me = psutil.Process()
    before = cpu_s([me])
    # One thread listed in /proc/PID/task whose schedstat is gone by the time it is read, as in a race.
    listdir = os.listdir
    monkeypatch.setattr(
        os, "listdir", lambda path: listdir(path) + (["999999999"] if path.endswith("/task") else [])
    )
    raced = cpu_s([me])
    # Not the tick total, which is at least 0.3 s more than the live threads' run times.
    assert 0 <= raced - before < 0.05


def _spin_thread_time(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
