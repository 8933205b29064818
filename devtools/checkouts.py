"""Alternating runs of one measurement over several checkouts of the product, for the benchmarks that compare code
side by side (``bench_send_cost``, ``bench_finish_cost``, ``python -m devtools.bench.finish_probe``): each
checkout's code measured in a process of its own, round by round, so that drift of the shared machine falls on both
alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence


def checkout_runs(
    script: str, measure: Callable[..., dict], args: Sequence[int], *, checkouts: str, rounds: int
) -> dict[str, list[dict]]:
    """``rounds`` runs of ``measure(*args)`` per checkout, alternated: in this process when ``checkouts``
    (comma-separated directories) is empty, else ``script`` run as ``python script ARG...`` in each checkout's
    directory (the script puts that directory first on ``sys.path``, so the checkout's code is what it imports),
    whose last stdout line is the run's JSON. Returns each checkout's runs (``"."`` without checkouts). Raises
    ``subprocess.CalledProcessError`` when a run fails."""
    dirs = [d for d in checkouts.split(",") if d]
    runs: dict[str, list[dict]] = {d: [] for d in dirs or ["."]}
    for _ in range(rounds):
        for d in runs:
            if not dirs:
                runs[d].append(measure(*args))
                continue
            out = subprocess.run(
                [sys.executable, os.path.abspath(script), *map(str, args)],
                cwd=d,
                capture_output=True,
                text=True,
                check=True,
            )
            runs[d].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs
