"""``static``: static (request-level) batching with ``model.generate`` on left-padded batches.

When the server is idle and a request arrives, it waits a short collection window (``window_ms``, default 50 ms)
after that request's arrival, then takes every request that has arrived, up to ``max_batch`` (default 32;
it starts at once when ``max_batch`` requests are already waiting). The batch is left-padded to its longest
prompt and decoded for its longest reply; requests arriving meanwhile wait for the whole batch to finish
(the head-of-line blocking that Orca's iteration-level scheduling removes).

Each row streams: its token k is timestamped at generate step k (per-step hook), and a row stops counting
after its own ``max_new_tokens`` -- the batch keeps computing it (padding work) until the longest row is done,
but those extra tokens are not counted as output.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import torch

from .common import System, generate_kwargs, make_step_timer, sleep_until
from .metrics import RequestRecord
from .workloads import Request


def collect_batch(
    pending: deque, t0: float, now: float, window_s: float, max_batch: int
) -> tuple[float | None, int]:
    """Batch-forming rule (pure, for tests): given pending requests sorted by arrival and the current time,
    return ``(start_time, batch_size)``: when the next batch starts and how many of the head requests it takes.

    The batch starts at ``max(now, first_arrival + window)``, or as soon as ``max_batch`` requests have
    arrived if that is earlier (but never before ``now``); it takes the requests arrived by then, capped.
    """
    if not pending:
        return None, 0
    first = t0 + pending[0].arrival_s
    start = max(now, first + window_s)
    arrivals = [t0 + r.arrival_s for r in pending]
    if len(arrivals) >= max_batch:
        start = min(start, max(now, arrivals[max_batch - 1]))
    size = sum(1 for a in arrivals if a <= start)
    return start, max(1, min(size, max_batch))


class StaticSystem(System):
    """Static batching: left-padded ``model.generate`` over what arrived in a short window; the batch waits
    for its longest reply."""

    name = "static"

    def __init__(self, bm, opts):
        super().__init__(bm, opts)
        self.window_s = float(opts.get("window_ms", 50.0)) / 1000.0
        self.max_batch = int(opts.get("max_batch", 32))

    def _generate_batch(self, batch: Sequence[Request]):
        longest = max(r.prompt_len for r in batch)
        pad = self.bm.pad_token_id
        ids = torch.full((len(batch), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for i, r in enumerate(batch):  # left padding, as decoder-only generation needs
            ids[i, longest - r.prompt_len :] = torch.tensor(r.prompt_token_ids, dtype=torch.long)
            mask[i, longest - r.prompt_len :] = 1
        max_new = max(r.max_new_tokens for r in batch)
        timer = make_step_timer()
        out = self.bm.model.generate(ids, attention_mask=mask, **generate_kwargs(self.bm, max_new, timer))
        new = out[:, longest:].tolist()
        return [(timer.times[: r.max_new_tokens], new[i][: r.max_new_tokens]) for i, r in enumerate(batch)]

    def warmup(self, requests: Sequence[Request]) -> None:
        rs = list(requests[:2])
        self._generate_batch(
            [Request(-1 - i, 0.0, r.prompt_token_ids[: 16 + 8 * i], 4) for i, r in enumerate(rs)]
        )

    def run(self, requests: Sequence[Request], t0: float) -> list[RequestRecord]:
        pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.rid)))
        records: list[RequestRecord] = []
        batch_sizes = []
        while pending:
            sleep_until(t0 + pending[0].arrival_s)  # idle until the next request exists
            start, size = collect_batch(pending, t0, time.perf_counter(), self.window_s, self.max_batch)
            sleep_until(start)
            batch = [pending.popleft() for _ in range(size)]
            batch_sizes.append(size)
            try:
                results = self._generate_batch(batch)
                errors = [None] * len(batch)
            except Exception as e:
                results = [([], [])] * len(batch)
                errors = [f"{type(e).__name__}: {e}"] * len(batch)
            for r, (times, toks), err in zip(batch, results, errors, strict=True):
                records.append(
                    RequestRecord(r.rid, t0 + r.arrival_s, r.prompt_len, r.max_new_tokens, times, toks, err)
                )
        self.notes.append(f"batch sizes {batch_sizes}")
        return records
