"""``ours``: chatsite's continuous-batching engine (``inference.engine.LLMEngine``).

Iteration-level scheduling (Orca, OSDI'22) with chunked prefill under a per-step token budget (vLLM's
``max_num_batched_tokens``). The engine runs in its own background thread (``engine.start()``); a feeder
submits each request at its arrival time and one consumer thread per request iterates ``handle.events()``,
stamping every token with ``perf_counter()`` when the client receives it (client-side timestamps, including
event delivery latency; tokens delivered in one event share a timestamp).

Replies have exactly the workload's length: ``SamplingParams(ignore_eos=True)`` (vLLM's flag of that name).

Token accounting: ``TokenEvent.token_ids`` omits tokens that produced no text; ``FinishEvent.usage`` has the
true count, and any tokens not seen in events are timestamped at the FinishEvent (noted in the cell).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from .common import System, sleep_until
from .metrics import RequestRecord
from .workloads import Request


class OursSystem(System):
    """Our engine in its background thread; one consumer thread per request stamps token times."""

    name = "ours"

    def __init__(self, bm, opts):
        super().__init__(bm, opts)
        from inference.engine import EngineConfig, LLMEngine, SamplingParams

        config = EngineConfig(
            max_num_seqs=int(opts.get("max_seqs", 32)),
            max_num_batched_tokens=int(opts["max_batch_tokens"]) if "max_batch_tokens" in opts else None,
            kv_cache_tokens=opts.get("kv_cache_tokens"),
            max_waiting=int(opts.get("max_waiting", 256)),
            device="cpu",
            num_threads=int(opts["threads"]) if opts.get("threads") else None,
        )
        self._SamplingParams = SamplingParams
        self.engine = LLMEngine(bm.engine_loaded, config, owns_model=True)
        self._started = False
        self._late_tokens = 0

    def _params(self, max_new_tokens: int):
        return self._SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True)

    def _ensure_started(self) -> None:
        if not self._started:
            self.engine.start()
            self._started = True

    def _consume(self, handle, rec: RequestRecord) -> None:
        """Drain one request's events into ``rec`` (runs in its own thread)."""
        try:
            for ev in handle.events():
                now = time.perf_counter()
                kind = type(ev).__name__
                if kind == "TokenEvent":
                    toks = list(getattr(ev, "token_ids", None) or [])
                    rec.token_ids.extend(toks)
                    rec.token_times.extend([now] * len(toks))
                elif kind == "FinishEvent":
                    err = getattr(ev, "error", None)
                    if err:
                        rec.error = str(err)
                    usage = getattr(ev, "usage", None)
                    missing = (getattr(usage, "completion_tokens", 0) or 0) - len(rec.token_times)
                    if missing > 0:  # tokens that produced no text are only counted in usage
                        rec.token_times.extend([now] * missing)
                        self._late_tokens += missing
                    break
        except Exception as e:
            rec.error = f"{type(e).__name__}: {e}"

    def warmup(self, requests: Sequence[Request]) -> None:
        self._ensure_started()
        threads = []
        for i, r in enumerate(requests[:2]):
            rec = RequestRecord(-1 - i, time.perf_counter(), 0, 4)
            h = self.engine.submit(list(r.prompt_token_ids[: 16 + 8 * i]), self._params(4))
            th = threading.Thread(target=self._consume, args=(h, rec), daemon=True)
            th.start()
            threads.append(th)
        for th in threads:
            th.join(timeout=300)

    def run(self, requests: Sequence[Request], t0: float) -> list[RequestRecord]:
        self._ensure_started()
        self._late_tokens = 0
        ordered = sorted(requests, key=lambda r: (r.arrival_s, r.rid))
        records = [RequestRecord(r.rid, t0 + r.arrival_s, r.prompt_len, r.max_new_tokens) for r in ordered]
        consumers = []
        for r, rec in zip(ordered, records, strict=True):
            sleep_until(rec.arrival)
            try:
                h = self.engine.submit(list(r.prompt_token_ids), self._params(r.max_new_tokens))
            except Exception as e:
                rec.error = f"{type(e).__name__}: {e}"
                continue
            th = threading.Thread(
                target=self._consume, args=(h, rec), name=f"ours-consumer-{r.rid}", daemon=True
            )
            th.start()
            consumers.append(th)
        deadline = time.perf_counter() + float(self.opts.get("timeout_s", 3600))
        for th in consumers:
            th.join(timeout=max(0.0, deadline - time.perf_counter()))
            if th.is_alive():
                self.notes.append("timed out waiting for a request")
                break
        if self._late_tokens:
            self.notes.append(f"{self._late_tokens} tokens not in any TokenEvent, stamped at FinishEvent")
        return records

    def close(self) -> None:
        if self._started:
            self.engine.shutdown()
            self._started = False
