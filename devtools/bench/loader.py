"""Model loading for the benchmark: one model, one dtype, for every system.

Every system runs exactly the weights our engine runs: ``inference.engine.prepare_model`` converts the
default model's GGUF once into ``<cache_dir>/<name>/`` and ``inference.engine.load_model`` loads it.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from inference.engine import DEFAULT_MODEL_SPEC, ModelSpec, load_model, prepare_model

#: The benchmarked model as a JSON-able dict (passed to each cell's subprocess).
DEFAULT_SPEC: dict[str, Any] = dataclasses.asdict(DEFAULT_MODEL_SPEC)


@dataclass
class BenchModel:
    """What a benchmark cell needs: the HF model, its tokenizer, and how long loading took (s)."""

    model: Any
    tokenizer: Any
    eos_token_ids: list[int]
    pad_token_id: int
    load_s: float
    engine_loaded: Any  # the engine's LoadedModel, for the ``ours`` system


def prepare(spec: dict, cache_dir: str) -> str:
    """Make the model cache ready before any cell runs (one-time GGUF conversion, ~20 s); return its directory."""
    return str(prepare_model(ModelSpec(**spec), cache_dir))


def load_tokenizer(model_dir: str):
    """The tokenizer saved in a prepared model directory."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def load(spec: dict, cache_dir: str, num_threads: int | None = None) -> BenchModel:
    """Load the model for a benchmark cell on the CPU, in ``spec["dtype"]``."""
    import torch

    if num_threads:
        torch.set_num_threads(num_threads)
    t = time.perf_counter()
    loaded = load_model(ModelSpec(**spec), cache_dir, device="cpu", num_threads=num_threads)
    model, tok = loaded.model, loaded.tokenizer
    model.eval()
    eos = list(loaded.eos_token_ids)
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    return BenchModel(model, tok, eos, int(pad), time.perf_counter() - t, loaded)
