"""Iteration-level scheduler with chunked prefill.

Every engine step the scheduler decides which tokens go through the model (Orca, OSDI '22:
"iteration-level scheduling"; vLLM's scheduler with chunked prefill, after Sarathi-Serve):

1. every running request that is decoding contributes one token (decodes are never starved);
2. requests still prefilling get prompt chunks, oldest admission first, from what is left of
   the per-step token budget (``max_num_batched_tokens``);
3. while budget remains, waiting requests are admitted in (aged priority desc, arrival) order
   (see ``Request.rank``) if a KV slot and their KV reservation (prompt + max_new_tokens) fit;
   admission stops at the first request that does not fit, so a large request is not starved by
   smaller ones behind it. An admitted request first takes the longest cached prefix of its
   prompt from the prefix cache (:mod:`.prefix_cache`) and prefills only the rest.

So a 1000-token prompt is split over several steps and the running decodes keep producing a
token every step. Requests leave as soon as they finish or are cancelled (their slot is reused
in the next step).

The scheduler is not thread-safe by itself: ``LLMEngine`` calls it under its lock.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass, field

from .kv_cache import KVCache
from .prefix_cache import PrefixCache
from .request import Request, RequestStatus
from .runner import StepBatch

logger = logging.getLogger(__name__)


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
    prefix_hit_tokens: int = 0

    @property
    def requests(self) -> list[Request]:
        return [r for r, _ in self.advances]


class Scheduler:
    """Waiting queue (bounded, priority-ordered) + running set + per-step batch construction.

    Args:
        kv: KV cache providing slots and the token budget.
        max_num_batched_tokens: Per-step token budget (decodes + prefill chunks).
        prefix_cache: Where admitted requests look up cached prompt prefixes (``None``: never).
    """

    def __init__(
        self, kv: KVCache, max_num_batched_tokens: int, prefix_cache: PrefixCache | None = None
    ) -> None:
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefix_cache = prefix_cache
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

    def pending_tokens(self) -> tuple[int, int]:
        """``(prefill, decode)`` tokens still to compute: prompt tokens not yet prefilled (waiting +
        partially prefilled requests; a waiting prompt counts in full, before any prefix-cache hit) and
        ``max_new_tokens - generated`` summed over waiting and running requests."""
        prefill = decode = 0
        for r in self._waiting:
            prefill += r.prompt_len
            decode += r.params.max_new_tokens
        for r in self.running:
            prefill += max(0, r.prompt_len - r.num_cached)
            decode += max(0, r.params.max_new_tokens - len(r.output_token_ids))
        return prefill, decode

    def drain_waiting(self) -> list[Request]:
        waiting, self._waiting = self._waiting, []
        return waiting

    # ------------------------------------------------------------------ running set
    def release(self, request: Request) -> None:
        """Drop a running request and free its KV slot (compacting the cache)."""
        if request.status is RequestStatus.RUNNING:
            self.release_many([request])

    def release_many(self, requests: list[Request]) -> None:
        """Drop the running requests one step finished and free their KV slots in one compaction
        (:meth:`.KVCache.release_many`: at most one K/V copy per request that goes on running)."""
        self.kv.release_many(requests)
        gone = {id(r) for r in requests}
        self.running[:] = [r for r in self.running if id(r) not in gone]

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
            if self.prefix_cache is not None and head.num_cached == 0:
                try:
                    head.num_cached = head.prefix_hit_tokens = self.prefix_cache.load_prefix(
                        head.prompt_token_ids, head.cache_salt, head.slot
                    )
                except Exception:  # a cache fault costs a full prefill, never the request
                    logger.exception("prefix cache lookup failed; prefilling the whole prompt")
                    head.num_cached = head.prefix_hit_tokens = 0
                step.prefix_hit_tokens += head.prefix_hit_tokens
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
