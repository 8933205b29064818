"""The engine's client API, as a mixin of :class:`~inference.engine.engine.LLMEngine`: submitting and cancelling
requests and reading the engine's occupancy (:class:`EngineLoad`), from any thread under the engine's condition lock.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from .detokenizer import OutputProcessor
from .errors import EngineStopped, InvalidRequest, QueueFull
from .request import Request, RequestHandle, RequestStatus
from .sampling import SamplerState, SamplingParams
from .scheduler import ScheduledStep
from .step_stats import StepStats

logger = logging.getLogger("inference.engine.engine")  # the engine's own logger: one name in the logs


@dataclass(frozen=True)
class EngineLoad:
    """Snapshot of the engine's occupancy (for admission control / metrics).

    Attributes:
        waiting: Requests in the waiting queue.
        running: Requests holding a KV slot (prefilling or decoding).
        kv_used_tokens: KV tokens reserved by running requests.
        kv_total_tokens: KV token budget.
        max_num_seqs: Maximum running requests.
        max_waiting: Waiting-queue bound.
        pending_prefill_tokens: Prompt tokens not yet prefilled (waiting requests in full, plus the
            rest of partially prefilled ones).
        pending_decode_tokens: ``max_new_tokens - generated`` summed over waiting and running
            requests (an upper bound: requests may stop early).
        decode_tokens_total: Tokens generated since the engine was built (monotonic counter; its
            rate is the decode throughput).
        prefix_cache_hit_tokens_total: Prompt tokens served from the prefix cache since start.
        prefix_cache_query_tokens_total: Prompt tokens of admitted requests since start (the hit
            rate is ``hit / query``).
        prefix_cache_tokens: Tokens held in the prefix cache now.
    """

    waiting: int
    running: int
    kv_used_tokens: int
    kv_total_tokens: int
    max_num_seqs: int
    max_waiting: int
    pending_prefill_tokens: int = 0
    pending_decode_tokens: int = 0
    decode_tokens_total: int = 0
    prefix_cache_hit_tokens_total: int = 0
    prefix_cache_query_tokens_total: int = 0
    prefix_cache_tokens: int = 0


class ClientApiMixin:
    """``submit``, ``cancel``, ``load``, ``queue_position``, step listeners (see :class:`~inference.engine.LLMEngine`)."""

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        request_id: str | None = None,
        cache_salt: str | None = None,
        token_events: bool = False,
    ) -> RequestHandle:
        """Queue a generation request. Thread-safe.

        Args:
            prompt_token_ids: Prompt tokens (e.g. from :meth:`render_chat`).
            params: Sampling parameters (defaults to ``SamplingParams()``).
            priority: Higher is admitted first (paid tier 10, free 0), aged by waiting time (see
                ``EngineConfig.priority_ageing_s``); FIFO within equal aged priority.
            request_id: Caller-chosen unique id; a random hex id by default.
            cache_salt: Prefix-cache namespace (vLLM's ``cache_salt``): only requests with the same
                salt share cached prefixes. Pass one per user (e.g. ``"user:42"``) so no user's
                timing can reveal another's prompts. ``None`` is the shared unsalted namespace.
            token_events: Also stream a :class:`SampledTokenEvent` for every sampled token
                (special tokens and EOS included), each before the text it contributes to.

        Returns:
            A handle to stream events from / cancel the request.

        Raises:
            InvalidRequest: empty/invalid prompt, bad sampling values, prompt + max_new_tokens
                over the context length or KV capacity, duplicate ``request_id``.
            QueueFull: ``EngineConfig.max_waiting`` requests are already waiting.
            EngineStopped: the engine was shut down.
        """
        params = params if params is not None else SamplingParams()
        params.validate()
        prompt = self._validate_prompt(prompt_token_ids, params)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidRequest(f"priority must be an integer, got {priority!r}")
        rid = request_id if request_id is not None else uuid.uuid4().hex
        if not isinstance(rid, str) or not rid:
            raise InvalidRequest("request_id must be a non-empty string")
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise InvalidRequest(f"cache_salt must be a string or None, got {type(cache_salt).__name__}")
        with self._cond:
            if self._stopping or self._stopped:
                raise EngineStopped("engine is shut down")
            if rid in self._requests:
                raise InvalidRequest(f"request_id {rid!r} is already in use")
            waiting = self._scheduler.num_waiting
            if waiting >= self.config.max_waiting:
                raise QueueFull(waiting, self.config.max_waiting)
            self._arrival_seq += 1
            req = Request(
                request_id=rid,
                prompt_token_ids=prompt,
                params=params,
                priority=priority,
                arrival_seq=self._arrival_seq,
                sampler=SamplerState.create(params, prompt),
                output=OutputProcessor(self._decode, params.stop),
                cache_salt=cache_salt,
                token_events=bool(token_events),
            )
            ageing = self.config.priority_ageing_s
            req.rank = req.arrival_time / ageing - priority if ageing else float(-priority)
            self._requests[rid] = req
            self._scheduler.add(req)
            self._cond.notify_all()
        return RequestHandle(self, req)

    def _validate_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> list[int]:
        try:
            prompt = [int(t) for t in prompt_token_ids]
        except (TypeError, ValueError):
            raise InvalidRequest("prompt_token_ids must be a list of integers") from None
        if not prompt:
            raise InvalidRequest("prompt is empty")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise InvalidRequest(f"prompt contains token ids outside the vocabulary [0, {self.vocab_size})")
        total = len(prompt) + params.max_new_tokens
        if total > self.context_length:
            raise InvalidRequest(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({params.max_new_tokens}) = {total} "
                f"exceeds the context length {self.context_length}"
            )
        capacity = min(self.kv.slot_len, self.kv.budget_tokens)
        if total > capacity:
            raise InvalidRequest(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({params.max_new_tokens}) = {total} "
                f"exceeds the KV cache capacity {capacity}"
            )
        return prompt

    def cancel(self, request_id: str) -> bool:
        """Cancel a request. Thread-safe.

        A waiting request finishes immediately with ``"cancelled"``; a running one is removed at
        the start of the next step (its slot and KV reservation are freed there).

        Returns:
            ``False`` if the id is unknown or the request already finished.
        """
        with self._cond:
            req = self._requests.get(request_id)
            if req is None or req.status is RequestStatus.FINISHED:
                return False
            if req.status is RequestStatus.WAITING:
                self._scheduler.remove_waiting(req)
                self._finish(req, "cancelled")
            else:
                self._cancel_requested.add(request_id)
                self._cond.notify_all()
            return True

    def has_unfinished(self) -> bool:
        """``True`` while any request is waiting or running."""
        with self._cond:
            return bool(self._requests)

    def load(self) -> EngineLoad:
        """Current occupancy and counters. Thread-safe; O(waiting + running)."""
        with self._cond:
            prefill, decode = self._scheduler.pending_tokens()
            return EngineLoad(
                waiting=self._scheduler.num_waiting,
                running=len(self._scheduler.running),
                kv_used_tokens=self.kv.used_tokens,
                kv_total_tokens=self.kv.budget_tokens,
                max_num_seqs=self.config.max_num_seqs,
                max_waiting=self.config.max_waiting,
                pending_prefill_tokens=prefill,
                pending_decode_tokens=decode,
                decode_tokens_total=self._decode_tokens_total,
                prefix_cache_hit_tokens_total=self.prefix_cache.hit_tokens_total,
                prefix_cache_query_tokens_total=self.prefix_cache.query_tokens_total,
                prefix_cache_tokens=self.prefix_cache.num_tokens,
            )

    def add_step_listener(self, fn: Callable[[StepStats], None]) -> None:
        """Call ``fn(stats)`` on the engine loop thread after every step that ran a batch.

        Keep ``fn`` cheap (it delays the next step); exceptions it raises are logged and swallowed.
        """
        with self._cond:
            self._step_listeners = [*self._step_listeners, fn]

    def remove_step_listener(self, fn: Callable[[StepStats], None]) -> None:
        """Undo :meth:`add_step_listener` (no error if ``fn`` was not added)."""
        with self._cond:
            self._step_listeners = [f for f in self._step_listeners if f != fn]

    def _notify_step(
        self, step: ScheduledStep, started: float, sampled: int, phases: tuple[float, float, float]
    ) -> None:
        # On the loop thread after a step that ran a batch; ``phases``: forward_s, apply_s and
        # apply_cpu_s of StepStats.
        b = step.batch
        with self._cond:
            stats = StepStats(
                started_at=started,
                duration_s=time.perf_counter() - started,
                num_running=len(self._scheduler.running),
                num_waiting=self._scheduler.num_waiting,
                batch_size=len(step.advances),
                num_prefill_tokens=b.num_tokens - b.num_decode,
                num_decode_tokens=b.num_decode,
                num_sampled_tokens=sampled,
                num_finished=self._step_finished,
                num_prefix_cache_hit_tokens=step.prefix_hit_tokens,
                kv_used_tokens=self.kv.used_tokens,
                kv_total_tokens=self.kv.budget_tokens,
                num_threads=self.num_threads,
                forward_s=phases[0],
                apply_s=phases[1],
                apply_cpu_s=phases[2],
                finish_kv_s=self._step_finish_kv_s,
                finish_kv_cpu_s=self._step_finish_kv_cpu_s,
            )
            listeners = self._step_listeners
        for fn in listeners:
            try:
                fn(stats)
            except Exception:
                logger.exception("step listener %r failed", fn)

    def queue_position(self, request_id: str) -> int | None:
        """0-based position among waiting requests in admission order; ``None`` if not waiting."""
        with self._cond:
            req = self._requests.get(request_id)
            if req is None or req.status is not RequestStatus.WAITING:
                return None
            return self._scheduler.waiting_position(req)
