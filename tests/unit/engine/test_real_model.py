"""The real default model (SmolLM2-135M-Instruct, dequantized GGUF) in float32.

Marked ``slow``: the first run converts the GGUF into the model cache (~20 s); afterwards the
whole module takes a few seconds.
"""

from __future__ import annotations

import pytest

from inference.engine import EngineConfig, LLMEngine, SamplingParams, load_model

from .conftest import model_cache_dir
from .helpers import assert_greedy_equal, collect, event_tokens, reference_greedy

pytestmark = pytest.mark.slow

MAX_NEW = 24
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain in one paragraph why the sky is blue. Be precise and mention Rayleigh scattering, "
    "the wavelength dependence, and why sunsets look red. " * 2,
    "List three primary colors.",
]


@pytest.fixture(scope="module")
def real_case(real_loaded):
    engine = LLMEngine(real_loaded, EngineConfig(device="cpu", max_num_seqs=4, kv_cache_tokens=4 * 512))
    prompts = [engine.render_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    refs = [reference_greedy(real_loaded.model, p, MAX_NEW, real_loaded.eos_token_ids) for p in prompts]
    engine.shutdown()
    return prompts, refs


@pytest.mark.parametrize("budget", [512, 32])
def test_real_model_greedy_equals_generate(real_loaded, real_case, budget):
    prompts, refs = real_case
    assert max(len(p) for p in prompts) > 32  # budget 32 forces chunked prefill
    engine = LLMEngine(
        real_loaded,
        EngineConfig(device="cpu", max_num_seqs=3, max_num_batched_tokens=budget, kv_cache_tokens=4 * 512),
    )
    order = [2, 0, 3, 1] if budget == 32 else [0, 1, 2, 3]
    handles = {}
    for n, i in enumerate(order):
        handles[i] = engine.submit(prompts[i], SamplingParams(temperature=0, max_new_tokens=MAX_NEW))
        if budget == 32:  # staggered arrivals: join mid-prefill / mid-decode
            for _ in range(n + 1):
                engine.step()
    engine.run_until_idle()
    for i, prompt in enumerate(prompts):
        events, finish = collect(handles[i], timeout=0)
        assert_greedy_equal(
            real_loaded.model, prompt, event_tokens(events), refs[i], real_loaded.eos_token_ids, finish
        )
    assert engine.load().kv_used_tokens == 0
    engine.shutdown()


def test_real_model_chat_answer_and_stream(real_loaded, real_case):
    prompts, refs = real_case
    engine = LLMEngine(real_loaded, EngineConfig(device="cpu", max_num_seqs=2, kv_cache_tokens=2 * 512))
    handle = engine.submit(
        prompts[0], SamplingParams(temperature=0, max_new_tokens=MAX_NEW, stop=("France",))
    )
    engine.run_until_idle()
    events, finish = collect(handle, timeout=0)
    reference_text = real_loaded.tokenizer.decode(refs[0], skip_special_tokens=True)
    assert "Paris" in reference_text
    assert finish.finish_reason == "stop" and "France" not in finish.text
    assert reference_text.startswith(finish.text)
    engine.shutdown()


def test_an_engine_owning_the_real_model_frees_its_float_weights_and_gives_the_same_tokens(
    real_loaded, real_case
):
    # What the worker runs (LLMEngine.from_spec): the default model's projections kept only as packed copies and
    # GGUF blocks, its embedding looked up from the Q8_0 blocks of the tied lm_head.
    prompts, refs = real_case
    own = load_model(real_loaded.spec, model_cache_dir(), device="cpu")
    engine = LLMEngine(
        own, EngineConfig(device="cpu", max_num_seqs=4, kv_cache_tokens=4 * 512), owns_model=True
    )
    try:
        runner = engine._runner
        if runner.lm_head.kernel_for(1) != "linear_blocks":
            pytest.skip("no native kernels here (no compiler): nothing is released")
        assert runner.embed is None and runner.embed_blocks is not None and runner.embed_blocks.kind == "q8_0"
        assert all(lw.gate_up.weight is None for lw in runner.layers)
        handles = [engine.submit(p, SamplingParams(temperature=0, max_new_tokens=MAX_NEW)) for p in prompts]
        engine.run_until_idle()
        for prompt, handle, ref in zip(prompts, handles, refs, strict=True):
            events, finish = collect(handle, timeout=0)
            assert_greedy_equal(
                real_loaded.model, prompt, event_tokens(events), ref, real_loaded.eos_token_ids, finish
            )
    finally:
        engine.shutdown()
