"""Django-side view of the model registry: turns ``settings.INFERENCE_MODELS`` into engine objects.

This is the only place where settings meet ``inference.engine``, which itself knows nothing of Django.
"""

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from inference.engine import EngineConfig, ModelSpec, UnknownModel


def model_spec(name: str | None = None) -> ModelSpec:
    """The :class:`ModelSpec` registered under ``name`` (default: ``INFERENCE_DEFAULT_MODEL``); for an alias
    (``INFERENCE_MODEL_ALIASES``) its target's spec, so the weights are prepared and loaded once. Raises :class:`UnknownModel` for a name not in ``INFERENCE_MODELS``."""
    name = name or settings.INFERENCE_DEFAULT_MODEL
    try:
        entry = settings.INFERENCE_MODELS[name]
    except KeyError as exc:
        raise UnknownModel(
            f"unknown model {name!r}; known: {', '.join(sorted(settings.INFERENCE_MODELS))}"
        ) from exc
    if entry.get("alias_of"):
        # An alias loads its target's prepared copy (cache_dir/<target>/): same weights, one conversion.
        return model_spec(entry["alias_of"])
    return ModelSpec(
        name=name,
        source=entry["source"],
        gguf_file=entry.get("gguf_file"),
        dtype=entry.get("dtype", "bfloat16"),
        context_length=int(entry.get("context_length", 2048)),
        cpu_float32_fallback=bool(entry.get("cpu_float32_fallback", True)),
    )


def queue_for(model_name: str, version: str = "") -> str:
    """The broker queue whose workers serve ``model_name``: ``inference.<model_name>`` (declared with
    ``x-max-priority`` in ``settings.CELERY_TASK_QUEUES`` for every registered model), or
    ``inference.<model_name>@<version>`` for the replies pinned to one version during a blue-green rollout
    (declared the same way by :func:`declare_queue`)."""
    return f"inference.{model_name}@{version}" if version else f"inference.{model_name}"


def queue_options(name: str) -> dict:
    """Keyword arguments of ``kombu.Queue`` for an inference queue: the direct ``inference`` exchange and
    ``x-max-priority``, as in ``settings.CELERY_TASK_QUEUES`` (a queue must be declared identically by
    producers and consumers)."""
    from kombu import Exchange

    return {
        "exchange": Exchange("inference", type="direct"),
        "routing_key": name,
        "queue_arguments": {"x-max-priority": settings.INFERENCE_QUEUE_MAX_PRIORITY},
    }


def declare_queue(name: str) -> str:
    """Make the Celery app know queue ``name`` with :func:`queue_options` (for version queues, which are not
    in ``CELERY_TASK_QUEUES``); returns ``name``."""
    from celery import current_app
    from kombu import Queue

    queues = current_app.amqp.queues
    if name not in queues:
        queues.add(Queue(name, **queue_options(name)))
    return name


def task_priority(queue_priority: int) -> int:
    """A tier's ``queue_priority`` as an AMQP message priority, clamped to 0..INFERENCE_QUEUE_MAX_PRIORITY."""
    return max(0, min(int(queue_priority), settings.INFERENCE_QUEUE_MAX_PRIORITY))


def _memory_target(mb: float) -> float | None:
    """``INFERENCE_KV_CACHE_MEMORY_MB``: -1 means no target (``None``); other negative values are refused.

    Raises:
        ImproperlyConfigured: a negative value other than -1.
    """
    if mb == -1:
        return None
    if mb < 0:
        raise ImproperlyConfigured(f"INFERENCE_KV_CACHE_MEMORY_MB must be >= 0 or -1 (no target), got {mb}")
    return mb


def _kernel_memory(value: str) -> str:
    """``INFERENCE_KERNEL_MEMORY``: ``fast`` or ``low`` (``EngineConfig.kernel_memory``).

    Raises:
        ImproperlyConfigured: anything else.
    """
    if value not in ("fast", "low"):
        raise ImproperlyConfigured(f"INFERENCE_KERNEL_MEMORY must be 'fast' or 'low', got {value!r}")
    return value


def engine_config() -> EngineConfig:
    """Engine limits from settings (``INFERENCE_*``)."""
    return EngineConfig(
        max_num_seqs=settings.INFERENCE_MAX_NUM_SEQS,
        max_num_batched_tokens=settings.INFERENCE_MAX_BATCHED_TOKENS,
        max_waiting=settings.INFERENCE_MAX_WAITING,
        device=settings.INFERENCE_DEVICE,
        num_threads=settings.INFERENCE_NUM_THREADS,
        adaptive_threads=settings.INFERENCE_ADAPTIVE_THREADS,
        priority_ageing_s=settings.INFERENCE_PRIORITY_AGEING_S or None,
        prefix_cache_tokens=settings.INFERENCE_PREFIX_CACHE_TOKENS,
        kv_cache_memory_mb=_memory_target(settings.INFERENCE_KV_CACHE_MEMORY_MB),
        native_kernels=settings.INFERENCE_NATIVE_KERNELS,
        kernel_memory=_kernel_memory(settings.INFERENCE_KERNEL_MEMORY),
    )


def models_for_tier(tier) -> list[str]:
    """Registered model names a tier may use, its own ``model_name`` first (then its ``degrade_to_model``
    where the tier has one). Names not in ``INFERENCE_MODELS`` are left out."""
    names = [tier.model_name, getattr(tier, "degrade_to_model", "") or ""]
    seen: list[str] = []
    for name in names:
        if name and name in settings.INFERENCE_MODELS and name not in seen:
            seen.append(name)
    return seen


def model_version(name: str | None = None) -> str:
    """The version string of a registered model (``INFERENCE_MODELS[name]["version"]``; ``""`` when none).
    ``INFERENCE_MODEL_VERSION`` overrides it for this process, so two workers can serve the same weights
    under two versions (blue-green tests and canaries)."""
    name = name or settings.INFERENCE_DEFAULT_MODEL
    override = getattr(settings, "INFERENCE_MODEL_VERSION", "")
    if override:
        return override
    return str(settings.INFERENCE_MODELS.get(name, {}).get("version", ""))
