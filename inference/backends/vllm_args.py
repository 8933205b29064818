"""vLLM's engine arguments, sampling parameters and step figures in chatsite's terms (for :mod:`.vllm`)."""

from __future__ import annotations

from dataclasses import dataclass

from inference.engine import SamplingParams, StepStats


@dataclass(frozen=True)
class VllmOptions:
    """Engine arguments a model registry entry may set (``INFERENCE_MODELS[name]["vllm"]``), as vLLM names them.

    Attributes:
        tensor_parallel_size: GPUs one model is split over (tensor parallelism).
        max_model_len: Maximum prompt + generated tokens (``None``: the model's own).
        gpu_memory_utilization: Fraction of GPU memory (on CPU: of host memory) vLLM may take, 0..1.
        quantization: vLLM quantization method (``"awq"``, ``"gptq"``, ``"fp8"``, ...) or ``None``.
        max_num_seqs: Running-request limit.
        kv_cache_memory_bytes: KV cache size, overriding ``gpu_memory_utilization`` where set.
        enforce_eager: Skip CUDA graphs / ``torch.compile`` (faster start, slower steps).
        extra: Any other ``AsyncEngineArgs`` field, passed through.
    """

    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    quantization: str | None = None
    max_num_seqs: int = 32
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False
    extra: tuple[tuple[str, object], ...] = ()

    @classmethod
    def from_dict(cls, data: dict) -> VllmOptions:
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        extra = tuple(sorted((k, v) for k, v in data.items() if k not in known))
        return cls(**{k: v for k, v in data.items() if k in known}, extra=extra)


def vllm_sampling(params: SamplingParams):
    """Chatsite's :class:`~inference.engine.SamplingParams` as vLLM's, streaming deltas."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else 0,
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        seed=params.seed,
        stop=list(params.stop) or None,
        max_tokens=params.max_new_tokens,
        ignore_eos=params.ignore_eos,
        output_kind=RequestOutputKind.DELTA,
    )


def queue_seconds(metrics) -> float | None:
    """Seconds a request waited in vLLM's queue (``scheduled_ts - queued_ts`` of its ``RequestStateStats``)."""
    queued, scheduled = getattr(metrics, "queued_ts", None), getattr(metrics, "scheduled_ts", None)
    return max(0.0, scheduled - queued) if queued and scheduled else None


def step_stats(sched, it, *, kv_total_tokens: int, previous: float, now: float) -> StepStats:
    """A :class:`~inference.engine.StepStats` from vLLM's ``SchedulerStats`` and ``IterationStats`` of one batch of
    engine-core outputs. vLLM reports a batch of outputs, not its step's start: the gap since the previous batch
    (``previous``, ``now``: ``perf_counter`` seconds; ``previous`` 0 for the first) is the step time while the
    engine is busy."""
    return StepStats(
        started_at=previous or now,
        duration_s=now - previous if previous else 0.0,
        num_running=sched.num_running_reqs,
        num_waiting=sched.num_waiting_reqs,
        batch_size=sched.num_running_reqs,
        num_prefill_tokens=int(getattr(getattr(it, "prompt_token_stats", None), "computed", 0) or 0),
        num_decode_tokens=it.num_generation_tokens,
        num_sampled_tokens=it.num_generation_tokens,
        num_finished=len(getattr(it, "finished_requests", ()) or ()),
        num_prefix_cache_hit_tokens=int(getattr(sched.prefix_cache_stats, "hits", 0)),
        kv_used_tokens=int(sched.kv_cache_usage * kv_total_tokens),
        kv_total_tokens=kv_total_tokens,
        num_preemptions=it.num_preempted_reqs,
    )
