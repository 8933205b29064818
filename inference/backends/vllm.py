"""vLLM as a library inside the worker process, behind :class:`~inference.backends.base.ServingEngine`.

vLLM's ``AsyncLLM`` (V1) runs on an asyncio loop owned by one thread of this process; its engine core (and, on
CPU, its model worker) are child processes of the worker, so they live and die with it. Chatsite's
guarantees map onto vLLM's own features:

* tier priority -> ``scheduling_policy="priority"``; vLLM serves the *lowest* value first, so a tier's
  ``queue_priority`` (paid 10, free 0) is passed negated;
* Stop and client disconnect -> the request's ``generate()`` task is cancelled, which makes vLLM ``abort`` it:
  the engine core drops it from the next scheduled step, freeing its KV blocks;
* the per-user prefix-cache namespace -> ``cache_salt`` of the prompt (vLLM's own name for it);
* metrics -> vLLM's ``PrometheusStatLogger`` registers its ``vllm:*`` series in this process's default
  registry, which the worker's metrics port serves; a small stat logger of ours turns each step's
  ``SchedulerStats``/``IterationStats`` into :class:`~inference.engine.StepStats` for the step listeners.

Faults: when the engine core dies vLLM raises ``EngineDeadError`` in every ``generate()``; each stream then
raises :class:`~inference.backends.base.EngineDead` carrying its text so far, and the death listeners run once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable

from inference.backends.base import EngineDead
from inference.backends.vllm_args import VllmOptions, queue_seconds, step_stats, vllm_sampling
from inference.backends.vllm_stream import VllmStream
from inference.engine import (
    EngineLoad,
    EngineStopped,
    FinishEvent,
    InvalidRequest,
    QueueFull,
    SamplingParams,
    StepStats,
    Timings,
    TokenEvent,
    Usage,
)

logger = logging.getLogger(__name__)

#: vLLM's finish reasons as chatsite's (``abort`` is what a cancelled request reports).
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled"}
#: Seconds between two looks at ``AsyncLLM.errored`` (a core that dies while idle is noticed this soon).
WATCH_INTERVAL_S = 0.5


class VllmEngine:
    """vLLM's ``AsyncLLM`` serving one model directory (a :class:`~inference.backends.base.ServingEngine`).

    Args:
        model_dir: A local Hugging Face-style directory (``config.json``, safetensors, tokenizer).
        dtype: ``"bfloat16"``, ``"float16"``, ``"float32"`` or ``"auto"``.
        options: vLLM engine arguments.
        max_waiting: Requests this worker queues before :class:`~inference.engine.QueueFull`.

    Raises:
        EngineDead: vLLM could not load the model (its message says why).
    """

    backend = "vllm"

    def __init__(self, model_dir: str, *, dtype: str, options: VllmOptions, max_waiting: int = 256):
        self.model_dir = str(model_dir)
        self.options = options
        self.max_waiting = max_waiting
        self._streams: dict[str, VllmStream] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[StepStats], None]] = []
        self._death_listeners: list[Callable[[str], None]] = []
        self._health = "loading"
        self._stopped = False
        self._decode_total = 0
        self._sched = None  # the last SchedulerStats
        self._prefix_hits = 0
        self._prefix_queries = 0
        self._last_record = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()
        try:
            self.llm = self._call(self._build(dtype)).result()
        except Exception as exc:
            self._health = f"model failed to load: {exc}"
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise EngineDead(self._health) from exc
        config = self.llm.vllm_config
        self.context_length = int(config.model_config.max_model_len)
        cache = config.cache_config
        self.kv_total_tokens = int((cache.num_gpu_blocks or 0) * cache.block_size)
        self.tokenizer = _load_tokenizer(self.model_dir)
        self._health = "ok"
        threading.Thread(target=self._watch, name="vllm-watch", daemon=True).start()

    # ------------------------------------------------------------------ construction
    async def _build(self, dtype: str):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        o = self.options
        args = AsyncEngineArgs(
            model=self.model_dir,
            dtype=dtype,
            tensor_parallel_size=o.tensor_parallel_size,
            max_model_len=o.max_model_len,
            gpu_memory_utilization=o.gpu_memory_utilization,
            kv_cache_memory_bytes=o.kv_cache_memory_bytes,
            quantization=o.quantization,
            max_num_seqs=o.max_num_seqs,
            enforce_eager=o.enforce_eager,
            scheduling_policy="priority",
            enable_prefix_caching=True,
            disable_log_stats=False,
            seed=0,
            **dict(o.extra),
        )
        return AsyncLLM.from_engine_args(args, stat_loggers=[self._stat_logger_factory()])

    def _stat_logger_factory(self):
        from vllm.v1.metrics.loggers import StatLoggerBase

        engine = self

        class StepListeners(StatLoggerBase):
            """Feeds :meth:`VllmEngine.add_step_listener` listeners and the load figures from vLLM's stats."""

            def __init__(self, vllm_config, engine_index: int = 0):
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
                engine._record(scheduler_stats, iteration_stats)

            def log_engine_initialized(self):
                pass

        return StepListeners

    def _call(self, coro) -> asyncio.Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    # ------------------------------------------------------------------ ServingEngine
    def start(self) -> None:
        """Nothing to do: vLLM's engine core steps from the moment it is built."""

    def render_chat(self, messages: list[dict]) -> list[int]:
        try:
            out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except Exception as exc:
            raise InvalidRequest(f"cannot render chat messages: {exc}") from exc
        if hasattr(out, "keys"):
            out = out["input_ids"]
        return [int(t) for t in out]

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> VllmStream:
        params = params if params is not None else SamplingParams()
        params.validate()
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise InvalidRequest("prompt is empty")
        total = len(prompt) + params.max_new_tokens
        if total > self.context_length:
            raise InvalidRequest(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({params.max_new_tokens}) = {total} "
                f"exceeds the context length {self.context_length}"
            )
        rid = request_id or uuid.uuid4().hex
        with self._lock:
            if self._stopped:
                raise EngineStopped("engine is shut down")
            if self._health != "ok":
                raise EngineDead(self._health)
            if rid in self._streams:
                raise InvalidRequest(f"request_id {rid!r} is already in use")
            waiting = self._waiting()
            if waiting >= self.max_waiting:
                raise QueueFull(waiting, self.max_waiting)
            stream = VllmStream(self, rid, len(prompt))
            self._streams[rid] = stream
        self._loop.call_soon_threadsafe(self._start_task, stream, prompt, params, priority, cache_salt)
        return stream

    def _start_task(self, stream, prompt, params, priority, cache_salt) -> None:
        stream._task = self._loop.create_task(self._generate(stream, prompt, params, priority, cache_salt))

    async def _generate(self, stream: VllmStream, prompt, params, priority: int, cache_salt) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        submitted = time.perf_counter()
        first = None
        text: list[str] = []
        tokens = seq = 0
        reason, error, queue_s = "error", None, None
        inputs = TokensPrompt(prompt_token_ids=prompt)
        if cache_salt:
            inputs["cache_salt"] = cache_salt
        try:
            async for out in self.llm.generate(
                inputs, vllm_sampling(params), stream.request_id, priority=-int(priority)
            ):
                o = out.outputs[0]
                if o.token_ids:
                    first = first or time.perf_counter()
                    tokens += len(o.token_ids)
                    self._decode_total += len(o.token_ids)
                if o.text or (out.finished and o.token_ids):
                    text.append(o.text)
                    stream.put(TokenEvent(stream.request_id, seq, o.text, list(o.token_ids)))
                    seq += 1
                if out.finished:
                    reason = FINISH_REASONS.get(o.finish_reason or "", "stop")
                    queue_s = queue_seconds(out.metrics)
        except asyncio.CancelledError:
            reason = "cancelled"
        except EngineDeadError:
            self._forget(stream)
            stream.put(
                EngineDead(
                    "the model server stopped (vLLM engine core died)",
                    text="".join(text),
                    completion_tokens=tokens,
                )
            )
            return
        except Exception as exc:  # a request vLLM refused, or a failure in this request only
            logger.exception("vLLM request %s failed", stream.request_id)
            reason, error = "error", str(exc) or type(exc).__name__
        now = time.perf_counter()
        ttft = (first - submitted) * 1000 if first else None
        self._forget(stream)
        stream.put(
            FinishEvent(
                request_id=stream.request_id,
                finish_reason=reason,
                text="".join(text),
                usage=Usage(prompt_tokens=stream.prompt_tokens, completion_tokens=tokens),
                timings=Timings(
                    queue_ms=queue_s * 1000 if queue_s is not None else (ttft or 0.0),
                    ttft_ms=ttft,
                    total_ms=(now - submitted) * 1000,
                ),
                error=error,
            )
        )

    def _forget(self, stream: VllmStream) -> None:
        stream.finished = True
        with self._lock:
            self._streams.pop(stream.request_id, None)

    def cancel(self, request_id: str) -> bool:
        """Cancel the request's ``generate()`` task: vLLM aborts it, and the engine core frees its KV blocks
        at its next step. ``False`` if unknown or finished."""
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is None or stream.finished:
            return False
        self._loop.call_soon_threadsafe(self._cancel_task, stream)
        return True

    @staticmethod
    def _cancel_task(stream: VllmStream) -> None:
        if stream._task is not None:
            stream._task.cancel()

    def _waiting(self) -> int:
        return self._sched.num_waiting_reqs if self._sched is not None else 0

    def load(self) -> EngineLoad:
        s = self._sched
        with self._lock:
            active = len(self._streams)
        running = s.num_running_reqs if s is not None else 0
        usage = s.kv_cache_usage if s is not None else 0.0
        return EngineLoad(
            waiting=max(self._waiting(), active - running),
            running=running,
            kv_used_tokens=int(usage * self.kv_total_tokens),
            kv_total_tokens=self.kv_total_tokens,
            max_num_seqs=self.options.max_num_seqs,
            max_waiting=self.max_waiting,
            decode_tokens_total=self._decode_total,
            prefix_cache_hit_tokens_total=self._prefix_hits,
            prefix_cache_query_tokens_total=self._prefix_queries,
        )

    def add_step_listener(self, fn: Callable[[StepStats], None]) -> None:
        self._listeners = [*self._listeners, fn]

    def _record(self, sched, it) -> None:
        """Called by vLLM on this process's output thread after each batch of engine-core outputs."""
        if sched is not None:
            self._sched = sched
            pc = sched.prefix_cache_stats
            self._prefix_hits += int(getattr(pc, "hits", 0))
            self._prefix_queries += int(getattr(pc, "queries", 0))
        if it is None or not self._listeners or sched is None:
            return
        now = time.perf_counter()
        previous, self._last_record = self._last_record, now
        stats = step_stats(sched, it, kv_total_tokens=self.kv_total_tokens, previous=previous, now=now)
        for fn in self._listeners:
            try:
                fn(stats)
            except Exception:
                logger.exception("step listener failed")

    # ------------------------------------------------------------------ health
    def health(self) -> str:
        return self._health

    def on_death(self, fn: Callable[[str], None]) -> None:
        self._death_listeners.append(fn)

    def _watch(self) -> None:
        while not self._stopped:
            time.sleep(WATCH_INTERVAL_S)
            if self.llm.errored and not self._stopped:
                self._health = "engine core died"
                logger.error("vLLM's engine core died; this worker serves nothing more")
                for fn in self._death_listeners:
                    try:
                        fn(self._health)
                    except Exception:
                        logger.exception("engine death listener failed")
                return

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Cancel every request, stop vLLM's engine core and the loop thread."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            ids = list(self._streams)
        for rid in ids:
            self.cancel(rid)
        try:
            self.llm.shutdown()
        except Exception:
            logger.warning("vLLM shutdown failed", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)


def _load_tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
