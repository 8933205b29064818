"""A JSON line per engine step, for finding where a step's time goes (``ENGINE_STEP_LOG``, docs/overhead.md).

The GPU worker adds :class:`StepLog` as a step listener when ``ENGINE_STEP_LOG`` names a file
(``inference.workerops.start_step_log``); ``python -m devtools.bench.step_log FILE`` summarises what it wrote
(the steady decode's step against the steps that finish many replies at once). Off by default: the Prometheus
histograms (:class:`observability.metrics.StepMetrics`) are what a deployment watches.
"""

from __future__ import annotations

import json
import logging
import threading

logger = logging.getLogger(__name__)

#: The :class:`~inference.engine.StepStats` fields each line carries (times in seconds, as the engine gives them).
FIELDS = (
    "started_at",
    "duration_s",
    "batch_size",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_finished",
    "num_threads",
    "forward_s",
    "apply_s",
    "apply_cpu_s",
    "finish_kv_s",
    "finish_kv_cpu_s",
)


class StepLog:
    """Step listener appending one JSON object per step (the :data:`FIELDS` of its ``StepStats``) to ``path``.

    Runs on the engine's loop thread: one ``json.dumps`` and one buffered write per step, flushed at every
    line so a stopped worker loses nothing. Raises ``OSError`` from the constructor when ``path`` cannot be
    opened; a later write error is logged once and the listener goes quiet."""

    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the worker
        self._failed = False
        self._lock = threading.Lock()  # close() may come from another thread than the engine loop's

    def __call__(self, stats) -> None:
        """Write one line for ``stats`` (a ``StepStats``)."""
        if self._failed:
            return
        line = json.dumps({name: getattr(stats, name) for name in FIELDS}, separators=(",", ":"))
        try:
            with self._lock:
                self._file.write(line + "\n")
        except OSError:
            self._failed = True
            logger.warning("could not write the engine step log %s; no more lines", self.path, exc_info=True)

    def close(self) -> None:
        """Close the file (tests; a worker keeps it open for its life)."""
        with self._lock:
            self._file.close()
            self._failed = True
