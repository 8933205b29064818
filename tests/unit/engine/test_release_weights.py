"""An engine that owns its model (``LLMEngine(..., owns_model=True)``, as ``LLMEngine.from_spec`` and the worker
build it) frees the float weights it also holds as packed copies and GGUF blocks: the model is held once,
its greedy output does not change, and the emptied model cannot be reused by mistake.

Also the pieces: the embedding looked up from its blocks, the bounded-memory recovery, and the eviction of a
memory-mapped checkpoint's pages (inference/engine/memory.py).
"""

import copy
import sys
import time
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from inference.engine import EngineConfig, LLMEngine, block_quant
from inference.engine.errors import EngineError
from inference.engine.loader import LoadedModel
from inference.engine.memory import drop_file_pages, trim_heap
from tests.unit.engine.helpers import gguf_roundtrip, greedy_tokens, needs_gcc

PROMPTS = [[5 + i, 9, 11 + 2 * i, 40] * (1 + i % 3) for i in range(9)]
LENGTHS = [4 + 3 * i for i in range(9)]


def fresh(loaded: LoadedModel) -> LoadedModel:
    """A copy of ``loaded`` with a model of its own (an owning engine empties the one it gets)."""
    return replace(loaded, model=copy.deepcopy(loaded.model))


def engine_for(loaded: LoadedModel, owns_model: bool) -> LLMEngine:
    return LLMEngine(
        loaded, EngineConfig(device="cpu", max_num_seqs=9, max_num_batched_tokens=64), owns_model=owns_model
    )


@needs_gcc
def test_an_owning_engine_frees_the_float_weights_and_generates_the_same_tokens(gguf_tiny_loaded):
    keeping = engine_for(fresh(gguf_tiny_loaded), owns_model=False)
    expected = greedy_tokens(keeping, PROMPTS, LENGTHS)
    keeping.shutdown()

    loaded = fresh(gguf_tiny_loaded)
    model = loaded.model
    engine = engine_for(loaded, owns_model=True)
    try:
        runner = engine._runner
        linears = [
            runner.lm_head,
            *(getattr(lw, p) for lw in runner.layers for p in ("qkv", "o", "gate_up", "down")),
        ]
        # covered: GGUF blocks for few rows, a packed copy (oneDNN's or the native kernel's) or the gated form beyond
        assert all(linear.weight is None and linear.covered for linear in linears)
        assert runner.embed is None and runner.embed_blocks is not None
        matrices = [
            p
            for n, p in model.named_parameters()
            if n.endswith("proj.weight") or "embed" in n or "lm_head" in n
        ]
        assert len(matrices) == 2 * 7 + 2 and all(p.numel() == 0 for p in matrices)
        assert all(p.numel() > 0 for n, p in model.named_parameters() if "norm" in n)
        assert loaded.weights_released
        assert greedy_tokens(engine, PROMPTS, LENGTHS) == expected
    finally:
        engine.shutdown()


@needs_gcc
def test_a_released_model_cannot_back_a_second_engine(gguf_tiny_loaded):
    loaded = fresh(gguf_tiny_loaded)
    engine_for(loaded, owns_model=True).shutdown()
    with pytest.raises(EngineError, match="released"):
        engine_for(loaded, owns_model=False)


def test_weights_without_a_block_form_are_kept(tiny_loaded):
    # Random float weights are no GGUF blocks: with nothing to read instead, every float weight stays.
    loaded = fresh(tiny_loaded)
    engine = engine_for(loaded, owns_model=True)
    try:
        assert engine._runner.embed is not None and engine._runner.embed_blocks is None
        assert all(p.numel() > 0 for p in loaded.model.parameters())
        handle_tokens = greedy_tokens(engine, PROMPTS[:2], [3, 3])
        assert [len(t) for t in handle_tokens] == [3, 3]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_embedding_rows_from_blocks_are_bit_for_bit_f_embedding(kind):
    weight = gguf_roundtrip(torch.randn(300, 64), kind)
    block = block_quant.recover(weight)
    assert block is not None and block.kind == kind
    ids = torch.tensor([0, 299, 7, 7, 123])
    assert torch.equal(block_quant.dequantize(block, ids), F.embedding(ids, weight))
    with pytest.raises(IndexError):
        block_quant.dequantize(block, torch.tensor([300]))


def test_recovery_in_row_chunks_matches_one_piece_and_checks_every_chunk(monkeypatch):
    weight = gguf_roundtrip(torch.randn(70, 64), "q4_1")
    whole = block_quant.recover(weight)
    monkeypatch.setattr(block_quant, "_CHUNK_ROWS", 16)
    chunked = block_quant.recover(weight)
    assert chunked is not None and chunked.kind == "q4_1"
    for name in ("qs", "d", "mn"):
        assert torch.equal(getattr(chunked, name), getattr(whole, name))
    spoiled = weight.clone()
    spoiled[65, 3] += 1e-3  # the last chunk is no longer block values
    assert block_quant.recover(spoiled) is None
    assert block_quant.recover(weight[:0]) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc/self/maps and madvise")
def test_file_pages_are_evicted_and_read_back_while_anonymous_memory_is_left_alone(tmp_path):
    values = torch.arange(3 * 4096, dtype=torch.float32)
    path = tmp_path / "weights.bin"
    path.write_bytes(values.numpy().tobytes())
    mapped = torch.from_file(str(path), shared=False, size=values.numel(), dtype=torch.float32)
    assert torch.equal(mapped, values)  # every page read, so resident
    assert drop_file_pages(mapped) >= 4096 * 2
    assert torch.equal(mapped, values)  # a file page read again after eviction: the file's bytes

    anonymous = values.clone()
    assert drop_file_pages(anonymous) == 0
    assert torch.equal(anonymous, values)
    assert drop_file_pages(torch.empty(0)) == 0
    trim_heap()  # callable any time; what it returns depends on the heap


def test_the_loop_thread_trims_the_heap_once_a_burst_is_over_and_not_between_requests(
    make_engine, monkeypatch
):
    from inference.engine import SamplingParams
    from inference.engine import engine as engine_module

    calls: list[float] = []

    def counting_trim() -> bool:
        calls.append(time.monotonic())
        return trim_heap()  # still the real thing: the spy only counts

    monkeypatch.setattr(engine_module, "trim_heap", counting_trim)
    monkeypatch.setattr(engine_module, "IDLE_TRIM_S", 0.5)
    engine = make_engine()  # building it trims once, after load
    started = time.monotonic()
    engine.start()
    params = SamplingParams(temperature=0.0, max_new_tokens=3, ignore_eos=True)
    for _ in range(3):  # back to back: never idle for IDLE_TRIM_S in between
        engine.submit([5, 9, 11], params).result(timeout=30)
    finished = time.monotonic()
    deadline = finished + 5
    while not [t for t in calls if t >= finished] and time.monotonic() < deadline:
        time.sleep(0.02)
    after = [t for t in calls if t >= finished]
    assert after and after[0] - finished >= 0.4  # after the quiet spell, not at once
    assert not [
        t for t in calls if started <= t < finished
    ]  # requests that follow each other never pay for one


@needs_gcc
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc/self/maps")
def test_an_owning_engine_evicts_every_loaded_projection_and_lets_go_of_the_checkpoint(
    gguf_tiny_loaded, tmp_path, monkeypatch
):
    from transformers import AutoModelForCausalLM

    from inference.engine import memory

    gguf_tiny_loaded.model.save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    checkpoint = str(tmp_path / "model.safetensors")

    def mapped() -> bool:
        with open("/proc/self/maps") as maps:
            return any(checkpoint in line for line in maps)

    assert mapped()  # transformers maps the file: the weights are views of it
    loaded_ptrs = {p.data_ptr() for n, p in model.named_parameters() if n.endswith("proj.weight")}
    evicted: list[int] = []
    real = memory.drop_file_pages

    def recording(tensor):
        evicted.append(tensor.data_ptr())
        return real(tensor)

    monkeypatch.setattr(memory, "drop_file_pages", recording)
    loaded = replace(gguf_tiny_loaded, model=model)
    engine = engine_for(loaded, owns_model=True)
    try:
        assert loaded_ptrs <= set(evicted)  # q, k and v too, not only their fused copy
        del model, loaded
        assert not mapped()  # no view of the file is left, so none of its pages stays resident
        assert [len(t) for t in greedy_tokens(engine, PROMPTS[:2], [3, 3])] == [3, 3]
    finally:
        engine.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("keep", [False, True])
def test_freed_step_memory_stays_for_the_next_step_once_the_engine_fixes_the_heap_thresholds(keep):
    # A fresh interpreter, as glibc's thresholds are process-wide and other tests' engines have set them here.
    import subprocess

    code = (
        "import sys, torch\n"
        "from inference.engine.memory import keep_freed_heap\n"
        "if sys.argv[1] == 'keep': assert keep_freed_heap()\n"
        "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096\n"
        "x = torch.ones(20 << 18)\n"  # 20 MB: one projection's output in a 2048-token step
        "before = rss(); del x; print((before - rss()) >> 20)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "keep" if keep else "default"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    returned_mb = int(done.stdout.split()[-1])
    # glibc's default hands a freed 20 MB block straight back (the next step faults it in again, zeroed).
    assert returned_mb == 0 if keep else returned_mb >= 19


def test_an_engine_on_cpu_fixes_the_heap_thresholds(make_engine, monkeypatch):
    from inference.engine import engine as engine_module

    calls = []
    monkeypatch.setattr(engine_module, "keep_freed_heap", lambda: calls.append(1) or True)
    make_engine()
    assert calls == [1]


def test_an_owning_build_hands_each_layers_freed_weights_back_as_it_goes(gguf_tiny_loaded, monkeypatch):
    # The freed weights sit between live heap chunks; trimmed only at the end, the build's RSS climbed ~350 MB
    # over the load for the default model (bf16) before falling back.
    from inference.engine import runner

    trims = []
    real = runner.memory.trim_heap
    monkeypatch.setattr(runner.memory, "trim_heap", lambda: trims.append(1) or real())
    layers = gguf_tiny_loaded.model.config.num_hidden_layers
    engine_for(fresh(gguf_tiny_loaded), owns_model=False).shutdown()
    assert trims == []  # a model it does not own keeps its weights: nothing to hand back
    engine_for(fresh(gguf_tiny_loaded), owns_model=True).shutdown()
    assert len(trims) == layers
