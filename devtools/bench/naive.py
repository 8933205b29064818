"""``naive``: one ``model.generate`` call per request, requests served FIFO in arrival order.

This is the usual "one request per call" server: no batching, so every decode step reads all weights for a
single token, and a request that arrives while another is being served waits for it to finish.
Token timestamps come from a per-step hook inside ``generate`` (see :func:`common.make_step_timer`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .common import System, generate_kwargs, make_step_timer, sleep_until
from .metrics import RequestRecord
from .workloads import Request


class NaiveSystem(System):
    """One ``model.generate`` call per request, FIFO: the usual one-request-per-call server."""

    name = "naive"

    def _generate_one(self, req: Request):
        ids = torch.tensor([list(req.prompt_token_ids)], dtype=torch.long)
        mask = torch.ones_like(ids)
        timer = make_step_timer()
        out = self.bm.model.generate(
            ids, attention_mask=mask, **generate_kwargs(self.bm, req.max_new_tokens, timer)
        )
        new = out[0, ids.shape[1] :].tolist()
        return timer.times[: req.max_new_tokens], new[: req.max_new_tokens]

    def warmup(self, requests: Sequence[Request]) -> None:
        r = requests[0]
        self._generate_one(Request(-1, 0.0, r.prompt_token_ids[:32], 4))

    def run(self, requests: Sequence[Request], t0: float) -> list[RequestRecord]:
        records = []
        for req in sorted(requests, key=lambda r: (r.arrival_s, r.rid)):
            arrival = t0 + req.arrival_s
            sleep_until(arrival)
            rec = RequestRecord(req.rid, arrival, req.prompt_len, req.max_new_tokens)
            try:
                rec.token_times, rec.token_ids = self._generate_one(req)
            except Exception as e:  # keep measuring the others; the error shows in the report
                rec.error = f"{type(e).__name__}: {e}"
            records.append(rec)
        return records
