"""Per-step engine figures handed to step listeners (``LLMEngine.add_step_listener``).

The hook for metrics exporters (Prometheus histograms of step time and batch size) and benchmarks,
in the spirit of vLLM's ``SchedulerStats`` / ``IterationStats``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepStats:
    """What one engine step did. Times are ``time.perf_counter()`` seconds.

    Attributes:
        started_at: When the step began (scheduling included).
        duration_s: Wall time of the step: scheduling, forward pass, sampling, detokenizing, streaming.
        num_running: Requests holding a KV slot after the step (finished ones already left).
        num_waiting: Requests waiting for admission after the step.
        batch_size: Requests that had tokens in this step's batch.
        num_prefill_tokens: Prompt tokens computed in this step (chunked prefill).
        num_decode_tokens: Decode tokens computed in this step (one per decoding request).
        num_sampled_tokens: Tokens sampled (decodes plus prefills that reached their prompt's end).
        num_finished: Requests that finished in this step (any finish_reason).
        num_prefix_cache_hit_tokens: Prompt tokens taken from the prefix cache by requests admitted
            in this step (not computed).
        kv_used_tokens: KV tokens reserved by running requests after the step.
        kv_total_tokens: KV token budget.
        num_preemptions: Requests preempted in this step (always 0: this engine reserves a
            request's whole KV at admission and never preempts).
        num_threads: Intra-op CPU threads the engine used as the step ended (adapts to contention, see
            :class:`~inference.engine.threads.AdaptiveThreads`; a long step may change it between layers).
        forward_s: Wall seconds of the forward pass and sampling.
        apply_s: Wall seconds of applying the sampled tokens: streaming them, detokenizing, finishing requests.
        apply_cpu_s: CPU seconds the loop thread used for that (``time.thread_time``; the intra-op threads'
            are not counted). ``apply_s`` well above it means the thread waited: for the GIL, or for a core.
        finish_kv_s: Wall seconds, within ``apply_s``, of the finished requests' K/V work (keeping their blocks
            in the prefix cache, freeing their slots).
        finish_kv_cpu_s: The loop thread's CPU seconds for that K/V work.

    The five phase figures are 0.0 from backends that do not measure them (vLLM).
    """

    started_at: float
    duration_s: float
    num_running: int
    num_waiting: int
    batch_size: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_sampled_tokens: int
    num_finished: int
    num_prefix_cache_hit_tokens: int
    kv_used_tokens: int
    kv_total_tokens: int
    num_preemptions: int = 0
    num_threads: int = 0
    forward_s: float = 0.0
    apply_s: float = 0.0
    apply_cpu_s: float = 0.0
    finish_kv_s: float = 0.0
    finish_kv_cpu_s: float = 0.0
