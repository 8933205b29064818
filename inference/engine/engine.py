"""``LLMEngine``: continuous-batching text generation over one loaded model.

Architecture (Orca's iteration-level scheduling + vLLM's engine loop, TGI-style streaming):

* ``submit`` (any thread) validates the request and appends it to a bounded, priority-ordered
  waiting queue; events are delivered through a per-request queue read by ``RequestHandle``.
* ``step`` (engine thread, or the caller in tests/benchmarks) runs one iteration: apply
  cancellations, let the :class:`~.scheduler.Scheduler` build a batch (all decodes + prefill
  chunks within the token budget, admitting waiting requests while KV room remains), run the
  batched forward (:class:`~.runner.ModelRunner`), sample every row with its own parameters,
  detokenize incrementally, apply stop conditions, stream events, and free finished slots so
  the next step can admit new work.
* ``start`` runs ``step`` in a background thread that sleeps on a condition variable when idle.
* Prefix caching (:mod:`.prefix_cache`): a finished request leaves the K/V of its full token
  blocks in an LRU store keyed by salted block hashes; a later prompt with the same salt and the
  same leading tokens skips prefilling them.
* Step listeners (:meth:`LLMEngine.add_step_listener`) receive a :class:`~.step_stats.StepStats`
  after every step.

Failures inside a step fail only the requests of that step (``finish_reason="error"``); the
engine keeps serving.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from .config import EngineConfig, ModelSpec, default_step_budget
from .detokenizer import make_decode_fn
from .engine_api import ClientApiMixin, EngineLoad
from .engine_requests import RequestLifecycleMixin
from .errors import EngineError, EngineStopped, InvalidRequest
from .kv_cache import KVCache
from .loader import LoadedModel, cpu_has_amx, load_model, resolve_device
from .memory import keep_freed_heap, trim_heap
from .prefix_cache import PrefixCache
from .request import (
    Request,
)
from .runner import ModelRunner
from .sampling import sample_next_tokens
from .scheduler import Scheduler
from .step_stats import StepStats
from .threads import AdaptiveThreads, default_num_threads, release_calling_thread_openmp_pool

logger = logging.getLogger(__name__)

__all__ = ["EngineLoad", "LLMEngine"]

#: Default per-request KV budget used when ``EngineConfig.kv_cache_tokens`` is ``None``.
DEFAULT_KV_TOKENS_PER_SEQ = 2048
#: Seconds without requests after which the loop thread trims the heap (:func:`.memory.trim_heap`) once: memory a
#: burst freed (prefill activations, evicted prefix blocks) goes back to the OS, while back-to-back requests never
#: pay for page faults on memory just given back.
IDLE_TRIM_S = 1.0


class LLMEngine(ClientApiMixin, RequestLifecycleMixin):
    """Continuous-batching generation engine.

    Args:
        loaded: Model + tokenizer from :func:`~inference.engine.load_model`.
        config: Scheduling and resource limits.

    Attributes:
        context_length: Maximum prompt + generated tokens per request.
        vocab_size: Rows of the output layer (valid token ids are ``0 .. vocab_size - 1``).
        eos_token_ids: Token ids that finish a request with ``"stop"``.
        kv: The :class:`~inference.engine.kv_cache.KVCache` (slots + token budget).

    Thread-safety: ``submit``, ``cancel``, ``load``, ``queue_position``, ``has_unfinished`` and
    ``RequestHandle`` methods may be called from any thread. ``step`` / ``run_until_idle`` are
    serialized by a lock (tests and benchmarks drive them directly instead of ``start``).

    Memory: the runner keeps packed copies of the weight matrices for oneDNN or, in bf16 on CPUs with AVX512-BF16 and
    no AMX, for the native VNNI kernel (one more model-sized buffer)
    and, for a model prepared from a GGUF file, the weights' block form (:mod:`.block_quant`); the KV
    cache commits at most what running requests reserved (see :mod:`.kv_cache`). With ``owns_model``
    the float weights those two forms cover are freed, so the model is held once, not twice.

    Raises:
        EngineError: ``loaded``'s weights were released by an engine that owned it (load it again).
    """

    def __init__(
        self, loaded: LoadedModel, config: EngineConfig | None = None, *, owns_model: bool = False
    ) -> None:
        """``owns_model``: nothing else will use ``loaded.model``, so the engine may free the float weights
        it holds in other forms (:class:`~.runner.ModelRunner`'s ``release_weights``); ``loaded.model``
        cannot run afterwards and no second engine can be built on ``loaded``. :meth:`from_spec` sets it."""
        if loaded.weights_released:
            raise EngineError("this model's weights were released by the engine that owned it; load it again")
        self.config = config or EngineConfig()
        self.loaded = loaded
        self.spec: ModelSpec = loaded.spec
        self.model = loaded.model
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self.num_threads = self.config.num_threads or default_num_threads()
        if loaded.device.type == "cpu":
            torch.set_num_threads(self.num_threads)
        cfg = self.model.config
        self.context_length = int(
            min(self.spec.context_length, getattr(cfg, "max_position_embeddings", 1 << 30))
        )
        kv_total = self.config.kv_cache_tokens
        if kv_total is None:
            kv_total = self.config.max_num_seqs * min(self.context_length, DEFAULT_KV_TOKENS_PER_SEQ)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv = KVCache(
            num_layers=cfg.num_hidden_layers,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=head_dim,
            num_slots=self.config.max_num_seqs,
            slot_len=min(self.context_length, kv_total),
            budget_tokens=kv_total,
            dtype=loaded.dtype,
            device=loaded.device,
        )
        self._runner = ModelRunner(
            self.model,
            self.kv,
            max_positions=self.context_length,
            native_kernels=self.config.native_kernels,
            kernel_memory=self.config.kernel_memory,
            release_weights=owns_model,
            block_weights=loaded.block_weights,
        )
        if owns_model:
            loaded.weights_released = True
            loaded.block_weights = {}  # the runner holds the ones it reads (fused ones as copies)
        trim_heap()
        if loaded.device.type == "cpu":
            keep_freed_heap()  # steps reuse the memory the previous one freed (no page faults per layer)
        self.vocab_size = self._runner.vocab_size
        self.prefix_cache = PrefixCache(
            self.kv, self.config.prefix_cache_block_size, self.config.prefix_cache_tokens
        )
        #: ``EngineConfig.kv_cache_memory_mb`` in token positions of this model's K/V (``None``: no target).
        self.kv_memory_tokens: int | None = None
        if self.config.kv_cache_memory_mb is not None:
            self.kv_memory_tokens = int(self.config.kv_cache_memory_mb * 1e6) // self.kv.bytes_per_token
        #: The per-step token budget in use (``EngineConfig.max_num_batched_tokens`` or the device's default).
        self.max_num_batched_tokens = self.config.max_num_batched_tokens or max(
            default_step_budget(loaded.device.type, loaded.dtype == torch.bfloat16, cpu_has_amx()),
            self.config.max_num_seqs,
        )
        if loaded.device.type == "cpu":  # oneDNN's primitives for every step size, before the first request
            warm_s = self._runner.warm_up(self.max_num_batched_tokens)
            if warm_s:
                logger.info(
                    "engine: matmul primitives for steps up to %d tokens built in %.1f s",
                    self.max_num_batched_tokens,
                    warm_s,
                )
        self._scheduler = Scheduler(
            self.kv,
            self.max_num_batched_tokens,
            self.prefix_cache if self.prefix_cache.enabled else None,
        )
        self._decode = make_decode_fn(loaded.tokenizer)
        self._gen = torch.Generator(device="cpu")
        self._gen.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1))

        # _cond guards the waiting queue, the request map, the cancel set and the running list
        # membership; _step_lock serializes steps (engine thread vs. direct step() calls).
        self._cond = threading.Condition(threading.RLock())
        self._step_lock = threading.Lock()
        self._requests: dict[str, Request] = {}
        self._cancel_requested: set[str] = set()
        self._arrival_seq = 0
        self._stopping = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._step_listeners: list[Callable[[StepStats], None]] = []
        self._decode_tokens_total = 0
        self._step_finished = 0
        # This step's finished requests' K/V work, seconds of wall and of the loop thread's CPU (StepStats).
        self._step_finish_kv_s = self._step_finish_kv_cpu_s = 0.0
        # While a step's results are applied: the requests it finished, freed together after its last token.
        self._deferred_releases: list | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_spec(
        cls,
        spec: ModelSpec,
        config: EngineConfig | None = None,
        cache_dir: str | os.PathLike[str] = "var/models",
    ) -> LLMEngine:
        """Load ``spec`` (preparing ``cache_dir/<spec.name>`` if needed) and build an engine.

        Raises:
            UnknownModel: the model source cannot be found.
            EngineError: conversion or loading failed, or the device is unavailable.
        """
        config = config or EngineConfig()
        device = resolve_device(config.device)
        loaded = load_model(spec, cache_dir, device=device, num_threads=config.num_threads)
        return cls(loaded, config, owns_model=True)

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def render_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of ``messages`` under the model's chat template, ending with the assistant
        generation prompt (``add_generation_prompt=True``).

        Raises:
            InvalidRequest: the template rejects the messages (e.g. bad roles).
        """
        try:
            out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # jinja errors, missing template
            raise InvalidRequest(f"cannot render chat messages: {exc}") from exc
        if hasattr(out, "keys"):
            out = out["input_ids"]
        if out and isinstance(out[0], list):
            out = out[0]
        return [int(t) for t in out]

    # ------------------------------------------------------------------ stepping
    def step(self) -> int:
        """Run one scheduler iteration synchronously.

        Returns:
            Number of tokens that went through the model (decodes + prefill tokens); 0 if idle.
        """
        with self._step_lock:
            if self._stopped:
                return 0
            started = time.perf_counter()
            self._step_finished = 0
            self._step_finish_kv_s = self._step_finish_kv_cpu_s = 0.0
            with self._cond:
                self._apply_cancellations()
                try:
                    step = self._scheduler.schedule()
                except Exception as exc:  # a scheduler bug must not kill the engine
                    logger.exception("scheduling failed")
                    self._fail_requests(list(self._scheduler.running), exc)
                    return 0
            if step is None:
                return 0
            forward_at = time.perf_counter()
            try:
                logits = self._runner.forward(step.batch)
                tokens = sample_next_tokens(
                    logits,
                    [r.sampler for r in step.sample_requests],
                    self._gen,
                    self._runner.argmax,
                    self._runner.sampler,
                )
            except Exception as exc:
                logger.exception("engine step failed for %d requests", len(step.advances))
                with self._cond:
                    self._fail_requests(step.requests, exc, clear_kv=True)
                tokens = None
            apply_at, apply_cpu = time.perf_counter(), time.thread_time()
            if tokens is not None:
                self._apply_results(step, tokens)
            with self._cond:
                self._fit_kv_memory()
            if self._step_listeners:
                applied = time.perf_counter() - apply_at, time.thread_time() - apply_cpu
                phases = (apply_at - forward_at, *applied)
                self._notify_step(step, started, 0 if tokens is None else len(tokens), phases)
            return step.batch.num_tokens

    def run_until_idle(self) -> None:
        """Call :meth:`step` until no request is waiting or running."""
        while self.has_unfinished():
            self.step()

    # ------------------------------------------------------------------ background thread
    def start(self) -> None:
        """Start the background loop thread (idempotent).

        Raises:
            EngineStopped: after :meth:`shutdown`.
        """
        with self._cond:
            if self._stopping or self._stopped:
                raise EngineStopped("engine is shut down")
            if self._thread is not None and self._thread.is_alive():
                return
            num_threads = self.num_threads
            if self.loaded.device.type == "cpu":
                release_calling_thread_openmp_pool()  # see threads.py
            self._thread = threading.Thread(
                target=self._loop, args=(num_threads,), name="llm-engine", daemon=True
            )
            self._thread.start()

    def _loop(self, num_threads: int) -> None:
        # OpenMP thread counts are per thread: apply the configured count to this one.
        torch.set_num_threads(num_threads)
        adaptive = None
        if self.config.adaptive_threads and self.loaded.device.type == "cpu" and num_threads > 1:
            adaptive = AdaptiveThreads(num_threads)  # see threads.py: follow CPU contention
            # a long (prefill) step is judged between its layers too, not only after it ends
            self._runner.between_layers = lambda: self._apply_threads(adaptive.poll_within_step())
        try:
            while True:
                with self._cond:
                    idle = not self._requests
                    if idle and not self._stopping:
                        self._cond.wait(IDLE_TRIM_S)
                    quiet = not self._requests and not self._stopping
                if quiet:
                    # a burst is over: hand back the KV pages of finished requests and what activations held
                    with self._step_lock:
                        self.kv.discard_stale()
                    trim_heap()
                with self._cond:
                    while not self._stopping and not self._requests:
                        if adaptive is None:
                            self._cond.wait()
                        elif not self._cond.wait(adaptive.interval_s):
                            adaptive.idle_tick()  # keep a fresh reading of the contention for resume()
                    if self._stopping:
                        return
                if idle and adaptive is not None:
                    # judge the contention of the last window, not of the whole idle spell (threads.py)
                    self._apply_threads(adaptive.resume())
                if adaptive is not None:
                    adaptive.step_started()
                try:
                    self.step()
                except Exception:  # step() already isolates request failures; be defensive
                    logger.exception("engine loop iteration failed")
                    time.sleep(0.01)
                if adaptive is not None:
                    self._apply_threads(adaptive.poll())
        finally:
            self._runner.between_layers = None
            self._abort_all()

    def _apply_threads(self, threads: int | None) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
            self.num_threads = threads
            logger.info("CPU contention: engine now uses %d intra-op thread(s)", threads)

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Stop accepting requests, stop the loop thread and fail outstanding requests with
        ``finish_reason="error"`` (``error="engine stopped"``). Idempotent.

        Args:
            timeout: Seconds to wait for the loop thread to finish its current step.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                logger.warning("engine thread did not stop within %ss", timeout)
                return  # it aborts outstanding requests itself when it exits
        self._abort_all()

    def _abort_all(self) -> None:
        with self._step_lock, self._cond:
            self._stopped = True
            pending = list(self._scheduler.running) + self._scheduler.drain_waiting()
            self._fail_requests(pending, EngineStopped("engine stopped"))

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
