"""Iteration-level scheduler with chunked prefill.

Every engine step the scheduler decides which tokens go through the model (Orca, OSDI '22:
"iteration-level scheduling"; vLLM's scheduler with chunked prefill, after Sarathi-Serve):

1. every running request that is decoding contributes one token (decodes are never starved);
2. requests still prefilling get prompt chunks, oldest admission first, from what is left of
   the per-step token budget (``max_num_batched_tokens``);
3. while budget remains, waiting requests are admitted in (priority desc, arrival) order if a KV
   slot and their KV reservation (prompt + max_new_tokens) fit; admission stops at the first
   request that does not fit, so a large request is not starved by smaller ones behind it.

So a 1000-token prompt is split over several steps and the running decodes keep producing a
token every step. Requests leave as soon as they finish or are cancelled (their slot is reused
in the next step).

The scheduler is not thread-safe by itself: ``LLMEngine`` calls it under its lock.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from .kv_cache import KVCache
from .request import Request, RequestStatus
from .runner import StepBatch


@dataclass
class ScheduledStep:
    """A :class:`StepBatch` plus the bookkeeping needed to apply its results.

    Attributes:
        batch: Model inputs.
        advances: ``(request, tokens)`` whose ``num_cached`` grows by ``tokens`` after the step.
        sample_requests: Requests receiving a new token, in ``batch.logit_rows`` order.
    """

    batch: StepBatch
    advances: list[tuple[Request, int]] = field(default_factory=list)
    sample_requests: list[Request] = field(default_factory=list)

    @property
    def requests(self) -> list[Request]:
        return [r for r, _ in self.advances]


class Scheduler:
    """Waiting queue (bounded, priority-ordered) + running set + per-step batch construction.

    Args:
        kv: KV cache providing slots and the token budget.
        max_num_batched_tokens: Per-step token budget (decodes + prefill chunks).
    """

    def __init__(self, kv: KVCache, max_num_batched_tokens: int) -> None:
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self._waiting: list[Request] = []  # sorted by Request.sort_key
        self.running: list[Request] = []  # in admission order

    # ------------------------------------------------------------------ waiting queue
    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def add(self, request: Request) -> None:
        bisect.insort(self._waiting, request, key=lambda r: r.sort_key)

    def remove_waiting(self, request: Request) -> bool:
        i = bisect.bisect_left(self._waiting, request.sort_key, key=lambda r: r.sort_key)
        if i < len(self._waiting) and self._waiting[i] is request:
            del self._waiting[i]
            return True
        return False

    def waiting_position(self, request: Request) -> int | None:
        i = bisect.bisect_left(self._waiting, request.sort_key, key=lambda r: r.sort_key)
        if i < len(self._waiting) and self._waiting[i] is request:
            return i
        return None

    def drain_waiting(self) -> list[Request]:
        waiting, self._waiting = self._waiting, []
        return waiting

    # ------------------------------------------------------------------ running set
    def release(self, request: Request) -> None:
        """Drop a running request and free its KV slot (compacting the cache)."""
        if request.status is RequestStatus.RUNNING:
            self.kv.release(request)
            try:
                self.running.remove(request)
            except ValueError:
                pass

    # ------------------------------------------------------------------ one step
    def schedule(self) -> ScheduledStep | None:
        """Build the next step's batch; ``None`` when there is nothing to run."""
        budget = self.max_num_batched_tokens
        step = ScheduledStep(batch=StepBatch())
        b = step.batch

        decodes = sorted((r for r in self.running if not r.is_prefilling), key=lambda r: r.slot)
        for r in decodes:
            b.token_ids.append(r.output_token_ids[-1])
            b.positions.append(r.num_cached)
            b.slots.append(r.slot)
            b.decode_slots.append(r.slot)
            b.logit_rows.append(len(b.token_ids) - 1)
            step.advances.append((r, 1))
            step.sample_requests.append(r)
        b.num_decode = len(decodes)
        budget -= len(decodes)

        for r in self.running:
            if budget <= 0:
                break
            if r.is_prefilling:
                budget -= self._add_prefill(step, r, budget)

        now = time.perf_counter()
        while budget > 0 and self._waiting:
            head = self._waiting[0]
            reserve = head.prompt_len + head.params.max_new_tokens
            if not self.kv.try_allocate(head, reserve):
                break
            self._waiting.pop(0)
            head.status = RequestStatus.RUNNING
            head.reserved_tokens = reserve
            head.admitted_time = now
            self.running.append(head)
            budget -= self._add_prefill(step, head, budget)

        if not b.token_ids:
            return None
        return step

    @staticmethod
    def _add_prefill(step: ScheduledStep, r: Request, budget: int) -> int:
        b = step.batch
        start = r.num_cached
        n = min(r.prompt_len - start, budget)
        b.token_ids.extend(r.prompt_token_ids[start : start + n])
        b.positions.extend(range(start, start + n))
        b.slots.extend([r.slot] * n)
        b.prefills.append((r.slot, start, n))
        step.advances.append((r, n))
        if start + n == r.prompt_len:
            b.logit_rows.append(len(b.token_ids) - 1)
            step.sample_requests.append(r)
        return n
