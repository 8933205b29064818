"""``manage.py bench_send_instructions``: the CPU instructions a page ``send``'s service executes in-process, counted
by Valgrind's callgrind, which a shared machine's noise cannot move (a send's CPU time, ``bench_send_cost``, varies
by more than a tenth of a millisecond from run to run on 2 vCPUs, the size of many levers).

Each checkout's ``bench_send_cost`` run (``generations.reply_request`` for a new conversation, committed, as the
consumer calls it: ``python devtools/management/commands/bench_send_cost.py N`` in that checkout) is counted twice
under ``valgrind --tool=callgrind``, with ``--sends`` A and B timed sends; the difference divided by B - A is what
one more send executes, start-up and clean-up cancelled out. The runs go two at a time (2 vCPUs): the counts do not
depend on what else runs. Instructions, not time: a round trip's wait costs none, and one instruction of the
interpreter's is not one of PostgreSQL's. Needs ``valgrind`` (Debian's package) and the stack's services
(PostgreSQL, Redis, RabbitMQ), not a stack. A benchmark that prints figures, not a test; docs/overhead-levers.md
(lever 61) holds them.

    manage.py bench_send_instructions --checkouts ../before,. --sends 2,22 --rounds 3
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

SCRIPT = Path("devtools/management/commands/bench_send_cost.py")
COLLECTED = re.compile(r"Collected : (\d+)")


def counted_instructions(checkout: str, sends: int) -> int:
    """Instructions callgrind counted for one ``bench_send_cost`` run of ``sends`` timed sends in ``checkout``.
    Raises ``CommandError`` when the run fails or callgrind printed no count."""
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/callgrind.out",
                sys.executable,
                str(SCRIPT),
                str(sends),
            ],
            cwd=checkout,
            capture_output=True,
            text=True,
        )
    found = COLLECTED.findall(run.stderr)
    if run.returncode != 0 or not found:
        raise CommandError(f"callgrind run in {checkout} ({sends} sends) failed:\n{run.stderr[-2000:]}")
    return int(found[-1])


class Command(BaseCommand):
    help = "Instructions a send's service executes in-process (callgrind), per checkout."

    def add_arguments(self, parser):
        parser.add_argument("--checkouts", default=".", help="comma-separated checkout directories")
        parser.add_argument("--sends", default="2,22", help="the two runs' timed sends, A,B (B > A)")
        parser.add_argument("--rounds", type=int, default=1, help="pairs of runs per checkout")

    def handle(self, *args, checkouts, sends, rounds, **options):
        if shutil.which("valgrind") is None:
            raise CommandError("valgrind is not installed (Debian: apt-get install valgrind)")
        low, high = (int(n) for n in sends.split(","))
        if high <= low:
            raise CommandError("--sends A,B needs B > A")
        dirs = [d for d in checkouts.split(",") if d]
        jobs = [(r, d, n) for r in range(rounds) for d in dirs for n in (low, high)]
        started = time.time()
        with ThreadPoolExecutor(max_workers=2) as pool:
            counts = dict(zip(jobs, pool.map(lambda job: counted_instructions(*job[1:]), jobs), strict=True))
        self.stdout.write(
            f"bench_send_instructions: {rounds} round(s) of runs of {low} and {high} sends per checkout, "
            f"{time.time() - started:.0f} s; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}"
        )
        self.stdout.write("| checkout | instructions per send, median [min-max] over rounds | per round |")
        self.stdout.write("|---|---|---|")
        for d in dirs:
            per_send = [(counts[(r, d, high)] - counts[(r, d, low)]) / (high - low) for r in range(rounds)]
            each = ", ".join(f"{v / 1e6:.2f} M" for v in per_send)
            self.stdout.write(
                f"| {d} | {statistics.median(per_send) / 1e6:.2f} M [{min(per_send) / 1e6:.2f}-"
                f"{max(per_send) / 1e6:.2f}] | {each} |"
            )
