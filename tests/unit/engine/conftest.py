"""Fixtures for the inference engine tests (no database, no Django).

* ``tokenizer``: the real SmolLM2 tokenizer, read from the prepared model cache when present,
  else straight from the GGUF file (a few seconds, no weight conversion).
* ``tiny_model``: a 2-layer random-weight ``LlamaForCausalLM`` over the real vocabulary, fp32,
  fixed seed: fast enough to compare the engine with ``model.generate`` in many scenarios.
* ``real_model`` (``slow`` tests only): the default SmolLM2-135M in float32, loaded through
  ``load_model`` (the first run converts the GGUF into the cache, ~20 s).

The cache directory is ``$MODEL_CACHE_DIR`` or the repository's ``var/models`` (gitignored), the one
``manage.py prepare_model`` fills before the suite runs; weights are never committed.
"""

from __future__ import annotations

import copy
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from inference.engine import EngineConfig, LLMEngine, ModelSpec, load_model  # noqa: E402
from inference.engine.config import DEFAULT_MODEL_SPEC  # noqa: E402
from inference.engine.loader import LoadedModel, _cache_is_complete, resolve_source  # noqa: E402

from .helpers import gguf_roundtrip  # noqa: E402

TINY_CONTEXT = 512


def model_cache_dir() -> Path:
    return Path(os.environ.get("MODEL_CACHE_DIR") or Path(__file__).resolve().parents[3] / "var" / "models")


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    # The CI box has 2 shared cores; more threads only add contention.
    torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    prepared = model_cache_dir() / DEFAULT_MODEL_SPEC.name
    if _cache_is_complete(prepared):
        return AutoTokenizer.from_pretrained(prepared)
    source = resolve_source(DEFAULT_MODEL_SPEC)
    return AutoTokenizer.from_pretrained(source, gguf_file=DEFAULT_MODEL_SPEC.gguf_file)


def build_tiny_model(vocab_size: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_CONTEXT,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        # Larger than the default 0.02 so random logits are well separated (no near-ties).
        initializer_range=0.15,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 2
    return model


@pytest.fixture(scope="session")
def tiny_loaded(tokenizer) -> LoadedModel:
    model = build_tiny_model(len(tokenizer))
    spec = ModelSpec(name="tiny", source="memory", dtype="float32", context_length=TINY_CONTEXT)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        spec=spec,
        device=torch.device("cpu"),
        dtype=torch.float32,
        eos_token_ids=(2,),
    )


@pytest.fixture
def make_engine(tiny_loaded):
    """Factory for engines over the tiny model; shuts them all down after the test."""
    engines: list[LLMEngine] = []

    def factory(loaded: LoadedModel | None = None, **overrides) -> LLMEngine:
        config = EngineConfig(
            **{"max_num_seqs": 8, "max_num_batched_tokens": 64, "device": "cpu", **overrides}
        )
        engine = LLMEngine(loaded or tiny_loaded, config)
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        engine.shutdown(timeout=10)


@pytest.fixture(scope="session")
def real_loaded() -> LoadedModel:
    spec = replace(DEFAULT_MODEL_SPEC, dtype="float32")
    return load_model(spec, model_cache_dir(), device="cpu")


@pytest.fixture(scope="session")
def gguf_tiny_loaded(tiny_loaded) -> LoadedModel:
    """The tiny model with every matrix replaced by its GGUF round trip: Q4_1 projections, Q8_0 embedding and
    lm_head, as the default model's file has them."""
    model = copy.deepcopy(tiny_loaded.model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                kind = "q8_0" if "embed" in name or "lm_head" in name else "q4_1"
                param.copy_(gguf_roundtrip(param, kind))
    return replace(tiny_loaded, model=model)
