"""A request's life inside the engine after scheduling, as a mixin of :class:`~inference.engine.engine.LLMEngine`:
sampled tokens appended and streamed, finishing (stop, length, cancel, error), the prefix cache fed with a finished
request's K/V, and the K/V memory target kept. All of it runs under the engine's condition lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .request import (
    FinishEvent,
    FinishReason,
    Request,
    RequestStatus,
    SampledTokenEvent,
    Timings,
    TokenEvent,
    Usage,
)
from .scheduler import ScheduledStep

logger = logging.getLogger("inference.engine.engine")  # the engine's own logger: one name in the logs


class RequestLifecycleMixin:
    """Token application and finishing for :class:`~inference.engine.LLMEngine`."""

    def _apply_results(self, step: ScheduledStep, tokens: list[int]) -> None:
        for req, n in step.advances:
            req.num_cached += n
        now = time.perf_counter()
        # The requests this step finishes keep their slots until every token is applied, then free them in one
        # compaction (Scheduler.release_many), which copies K/V only for requests that go on running.
        self._deferred_releases = []
        try:
            for req, token in zip(step.sample_requests, tokens, strict=True):
                if req.status is not RequestStatus.RUNNING:
                    continue
                try:
                    self._append_token(req, token, now)
                except Exception as exc:
                    logger.exception("post-processing failed for request %s", req.request_id)
                    with self._cond:
                        self._fail_requests([req], exc)
        finally:
            with self._cond:
                released, self._deferred_releases = self._deferred_releases, None
                if released:
                    with self._finish_kv_timed():
                        self._scheduler.release_many(released)

    @contextmanager
    def _finish_kv_timed(self) -> Iterator[None]:
        """Add the block's wall time and the loop thread's CPU time to this step's finished requests' K/V work
        (``StepStats.finish_kv_s``, ``finish_kv_cpu_s``; seconds)."""
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self._step_finish_kv_s += time.perf_counter() - wall
            self._step_finish_kv_cpu_s += time.thread_time() - cpu

    def _append_token(self, req: Request, token: int, now: float) -> None:
        req.output_token_ids.append(token)
        self._decode_tokens_total += 1
        if req.first_token_time is None:
            req.first_token_time = now
        if req.token_events:
            req.put(SampledTokenEvent(req.request_id, len(req.output_token_ids) - 1, token, now))
        req.sampler.record(token, self.vocab_size)
        reason: FinishReason | None = None
        if token in self.eos_token_ids and not req.params.ignore_eos:
            reason = "stop"
        else:
            delta, stopped = req.output.add_token(token)
            req.pending_token_ids.append(token)
            if delta:
                self._emit_text(req, delta)
            if stopped:
                reason = "stop"
            elif len(req.output_token_ids) >= req.params.max_new_tokens:
                reason = "length"
        if reason is not None:
            with self._cond:
                self._finish(req, reason)

    def _emit_text(self, req: Request, text: str) -> None:
        req.put(TokenEvent(req.request_id, req.next_event_seq, text, req.pending_token_ids))
        req.next_event_seq += 1
        req.pending_token_ids = []

    def _finish(self, req: Request, reason: FinishReason, error: str | None = None) -> None:
        if req.status is RequestStatus.FINISHED:
            return
        if req.output_token_ids:
            delta, stopped = req.output.finish()
            # Trailing tokens that produced no visible text (special tokens, text cut by a stop
            # string) are still reported so token_ids of all events == generated tokens - EOS.
            if delta or req.pending_token_ids:
                self._emit_text(req, delta)
            if stopped and reason == "length":
                reason = "stop"
        if req.status is RequestStatus.RUNNING:
            deferred = self._deferred_releases  # a list while a step's results are applied
            with self._finish_kv_timed():
                if reason != "error" and req.num_cached > 0 and self.prefix_cache.enabled:
                    self._keep_prefix(req)
                if deferred is not None:
                    # freed after the step's last token (_apply_results); step() then fits the memory target
                    deferred.append(req)
                else:
                    self._scheduler.release(req)
            self._step_finished += 1
            if deferred is None:
                self._fit_kv_memory()
        elif req.status is RequestStatus.WAITING:
            self._scheduler.remove_waiting(req)
        req.status = RequestStatus.FINISHED
        self._requests.pop(req.request_id, None)
        self._cancel_requested.discard(req.request_id)
        now = time.perf_counter()
        queued_until = req.admitted_time if req.admitted_time is not None else now
        timings = Timings(
            queue_ms=(queued_until - req.arrival_time) * 1e3,
            ttft_ms=(req.first_token_time - req.arrival_time) * 1e3
            if req.first_token_time is not None
            else None,
            total_ms=(now - req.arrival_time) * 1e3,
        )
        usage = Usage(prompt_tokens=req.prompt_len, completion_tokens=len(req.output_token_ids))
        req.put(FinishEvent(req.request_id, reason, req.output.text, usage, timings, error))

    def _keep_prefix(self, req: Request) -> None:
        # K/V of positions 0..num_cached-1 are in the slot: the prompt, then every generated token
        # that has been fed back (not the last one sampled).
        try:
            tokens = req.prompt_token_ids + req.output_token_ids
            self.prefix_cache.insert(tokens, req.cache_salt, req.slot, req.num_cached)
        except Exception:  # losing a cache entry only costs a later prefill
            logger.exception("could not keep the prefix of request %s", req.request_id)

    def _fit_kv_memory(self) -> None:
        """Keep the running requests' K/V, the retained freed slot pages and the prefix cache within
        ``kv_memory_tokens`` (``EngineConfig.kv_cache_memory_mb``), under ``_cond``.

        Over the target, the freed pages go back first (they only spare a later prefill its page faults), then the
        least recently used prefix blocks, down to the target less one step's worth of tokens (so growing decodes
        do not evict a few blocks every step); an evicted block's pages go back to the OS at once
        (:meth:`.PrefixCache.evict_to`).
        """
        limit = self.kv_memory_tokens
        if limit is None:
            return
        written = self.kv.written_tokens
        if written + self.kv.stale_tokens + self.prefix_cache.num_tokens <= limit:
            return
        self.kv.discard_stale()  # leaves no stale positions
        if written + self.prefix_cache.num_tokens > limit:
            self.prefix_cache.evict_to(limit - written - self.max_num_batched_tokens)

    def _fail_requests(self, requests: list[Request], exc: BaseException, clear_kv: bool = False) -> None:
        message = f"{type(exc).__name__}: {exc}"
        for req in requests:
            if req.status is RequestStatus.FINISHED:
                continue
            if clear_kv and req.status is RequestStatus.RUNNING and req.slot >= 0:
                # The step may have written partial K/V (or NaNs); scrub the whole reserved range
                # before the slot is reused so masked attention of later owners stays finite.
                self.kv.clear_slot_range(req.slot, min(self.kv.slot_len, req.reserved_tokens))
            try:
                self._finish(req, "error", error=message)
            except Exception:
                logger.exception("failed to finish request %s", req.request_id)

    def _apply_cancellations(self) -> None:
        if not self._cancel_requested:
            return
        for rid in list(self._cancel_requested):
            req = self._requests.get(rid)
            if req is not None:
                self._finish(req, "cancelled")
        self._cancel_requested.clear()
