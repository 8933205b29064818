"""Shared pieces of the baseline systems: the System interface, a per-step timestamp hook, clock helpers."""

from __future__ import annotations

import time
from collections.abc import Sequence

from .loader import BenchModel
from .metrics import RequestRecord
from .workloads import Request


def sleep_until(t: float) -> None:
    """Sleep until ``time.perf_counter()`` reaches ``t`` (returns at once if it already has)."""
    while True:
        dt = t - time.perf_counter()
        if dt <= 0:
            return
        time.sleep(min(dt, 0.05) if dt > 0.002 else dt)


class System:
    """A way of serving requests. Subclasses implement :meth:`run`.

    ``run(requests, t0)`` must deliver each request no earlier than ``t0 + request.arrival_s`` (the request's
    arrival) and return one :class:`RequestRecord` per request it served, with ``arrival`` set to that
    scheduled arrival time and one ``token_times`` entry per output token.
    """

    name = "system"

    def __init__(self, bm: BenchModel, opts: dict):
        self.bm = bm
        self.opts = opts
        self.notes: list[str] = []

    def warmup(self, requests: Sequence[Request]) -> None:
        """Run something small so one-time costs (kernel selection, allocator growth) are not measured."""

    def run(self, requests: Sequence[Request], t0: float) -> list[RequestRecord]:
        raise NotImplementedError

    def close(self) -> None:
        """Release background threads and caches."""


def make_step_timer():
    """A transformers ``StoppingCriteria`` that records ``perf_counter()`` once per generated token step.

    ``generate`` calls stopping criteria right after each new token is appended to every row (the first call
    follows the prefill), so ``times[k]`` is when token k of every row in the batch became available. It never
    stops anything.
    """
    import torch
    from transformers import StoppingCriteria

    class StepTimer(StoppingCriteria):
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return StepTimer()


def generate_kwargs(bm: BenchModel, max_new_tokens: int, timer) -> dict:
    """Greedy ``generate`` arguments with ignore-EOS semantics (EOS may be produced; generation goes on).

    ``eos_token_id=None`` removes the EOS stopping criterion (unlike ``min_new_tokens``, it does not mask the
    EOS logit, so the greedy tokens match an engine's ``ignore_eos``).
    """
    from transformers import StoppingCriteriaList

    return {
        "max_new_tokens": max_new_tokens,
        "do_sample": False,
        "eos_token_id": None,
        "pad_token_id": bm.pad_token_id,
        "stopping_criteria": StoppingCriteriaList([timer]),
    }
