"""GGUF block weights (inference/engine/block_quant.py, kernels/linear_blocks.c): Q4_1 / Q8_0 blocks are
recovered bit for bit from dequantized weights and from nothing else, the kernel matches F.linear on those
weights, and the engine uses it without changing its greedy output.

gguf-py's own quantize/dequantize (the package the loader converts GGUF files with) is the independent oracle.
"""

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from inference.engine import EngineConfig, LLMEngine
from inference.engine.block_quant import BlockWeight, dequantize, recover
from inference.engine.kernels import linear_blocks
from inference.engine.loader import checkpoint_blocks
from tests.unit.engine.helpers import gguf_roundtrip, greedy_tokens, needs_gcc, record_calls


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_recover_gives_back_gguf_blocks_bit_for_bit(kind):
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(100, 576, generator=gen) * 0.07
    weight[3, :32] = 0.25  # a constant block (d = 0)
    weight[4, 32:64] = -torch.linspace(0, 1, 32)
    stored = gguf_roundtrip(weight, kind)

    block = recover(stored)

    assert block is not None and block.kind == kind
    assert block.d.shape == (100, 18) and block.d.dtype == torch.float32
    assert torch.equal(block.d, block.d.half().float())  # float16 scales, as in the file
    assert torch.equal(dequantize(block), stored)
    assert block.nbytes < stored.numel() * 4 / 3.5


def test_recover_refuses_weights_that_are_not_exactly_block_quantized():
    gen = torch.Generator().manual_seed(4)
    plain = torch.randn(64, 128, generator=gen)
    q4 = gguf_roundtrip(plain, "q4_1")
    assert recover(plain) is None  # a trained / random float32 weight
    assert recover(q4.bfloat16()) is None  # bf16 rounding loses the blocks
    assert recover(q4[:, :100].contiguous()) is None  # in-features not a multiple of 32
    nudged = q4.clone()
    nudged[7, 5] = torch.nextafter(nudged[7, 5], torch.tensor(1.0))  # one value one ulp off
    assert recover(nudged) is None
    broken = q4.clone()
    broken[0, 0] = float("nan")
    assert recover(broken) is None


@needs_gcc
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 8, 19])
def test_linear_blocks_matches_f_linear_on_the_same_weights(kind, dtype, rows):
    kernel = linear_blocks()
    assert kernel is not None
    gen = torch.Generator().manual_seed(rows)
    stored = gguf_roundtrip(torch.randn(1000, 576, generator=gen) * 0.05, kind)  # 1000: not a multiple of 32
    block = recover(stored)
    bias = torch.randn(1000, generator=gen).to(dtype)
    x = torch.randn(rows, 576, generator=gen).to(dtype)

    got = kernel(x, block, bias)
    without_bias = kernel(x, block, None)

    want = F.linear(x.double(), stored.double(), bias.double())
    assert got.shape == (rows, 1000) and got.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(without_bias.double(), want - bias.double(), rtol=tol, atol=tol)


@needs_gcc
def test_linear_blocks_refuses_what_it_does_not_take():
    kernel = linear_blocks()
    assert kernel is not None
    block = recover(gguf_roundtrip(torch.randn(32, 64), "q4_1"))
    with pytest.raises(ValueError):
        kernel(torch.randn(kernel.MAX_ROWS + 1, 64), block, None)  # too many rows
    with pytest.raises(ValueError):
        kernel(torch.randn(1, 96), block, None)  # in-features do not match
    with pytest.raises(ValueError):
        kernel(torch.randn(1, 64).half(), block, None)  # float16
    with pytest.raises(ValueError):
        kernel(torch.randn(1, 64), block, torch.randn(31))  # bias of the wrong length
    bogus = BlockWeight("q5_0", block.qs, block.d, block.mn)
    with pytest.raises(ValueError):
        kernel(torch.randn(1, 64), bogus, None)


@needs_gcc
def test_engine_reads_the_blocks_and_its_greedy_output_does_not_change(make_engine, gguf_tiny_loaded):
    # Steps of 9 down to 1 decoding sequence: over MAX_ROWS (oneDNN), then the block kernel's rows.
    prompts = [[5 + i, 9, 11 + 2 * i, 40] * (1 + i % 3) for i in range(9)]
    lengths = [4 + 3 * i for i in range(9)]
    outputs = {}
    for native in (True, False):
        engine = make_engine(gguf_tiny_loaded, native_kernels=native, max_num_seqs=9)
        runner = engine._runner
        used = [
            runner.lm_head,
            *(getattr(layer, p) for layer in runner.layers for p in ("qkv", "o", "gate_up", "down")),
        ]
        assert all((op.kernel_for(1) in ("linear_blocks", "blocks_silu_mul")) is native for op in used)
        if native:
            assert (
                runner.lm_head.block_weight.kind == "q8_0"
                and runner.layers[0].qkv.block_weight.kind == "q4_1"
            )
        outputs[native] = greedy_tokens(engine, prompts, lengths)
    assert outputs[True] == outputs[False]
    assert [len(tokens) for tokens in outputs[True]] == lengths


@needs_gcc
def test_a_model_without_block_weights_keeps_the_float_kernels(make_engine):
    engine = make_engine(native_kernels=True)
    assert engine._runner.lm_head.kernel_for(1) == "linear_rows"


def test_checkpoint_blocks_recovers_a_prepared_checkpoints_block_weights_and_nothing_else(
    gguf_tiny_loaded, tmp_path
):
    gguf_tiny_loaded.model.save_pretrained(tmp_path)
    blocks = checkpoint_blocks(tmp_path)
    params = dict(gguf_tiny_loaded.model.named_parameters())
    matrices = {name for name, p in params.items() if p.dim() == 2}
    assert set(blocks) == matrices  # every projection and the embedding; no norm weight
    for name, block in blocks.items():
        assert block.kind == ("q8_0" if "embed" in name or "lm_head" in name else "q4_1")
        assert torch.equal(dequantize(block), params[name].detach())
    assert checkpoint_blocks(tmp_path / "missing") == {}


@needs_gcc
def test_a_bf16_engine_reads_the_checkpoints_blocks_for_one_row_steps_only(gguf_tiny_loaded, tmp_path):

    gguf_tiny_loaded.model.save_pretrained(tmp_path)
    exact = {name: p.detach().clone() for name, p in gguf_tiny_loaded.model.named_parameters()}
    model = copy.deepcopy(gguf_tiny_loaded.model).to(torch.bfloat16)
    loaded = replace(
        gguf_tiny_loaded, model=model, dtype=torch.bfloat16, block_weights=checkpoint_blocks(tmp_path)
    )
    engine = LLMEngine(
        loaded, EngineConfig(device="cpu", max_num_seqs=4, max_num_batched_tokens=64), owns_model=True
    )
    try:
        runner = engine._runner
        assert loaded.block_weights == {}  # handed to the runner, not held twice
        qkv, head = runner.layers[0].qkv, runner.lm_head
        assert qkv.kernel_for(1) == "linear_blocks" and qkv.rows_upto("linear_blocks") == 1
        assert head.block_weight.kind == "q8_0"
        # Blocks stacked in the fused order q, k, v: one row reads the exact float32 weights, not their bf16 rounding.
        want_qkv = torch.cat([exact[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
        assert torch.equal(dequantize(qkv.block_weight), want_qkv)
        x = torch.randn(2, want_qkv.shape[1]).to(torch.bfloat16)
        calls = []
        record_calls(qkv, "linear_blocks", calls)
        one = qkv(x[:1]).float()
        two = qkv(x).float()
        assert calls == [1]  # two rows went to the packed bf16 copy (the VNNI kernel's or oneDNN's)
        want = F.linear(x.float(), want_qkv)
        assert torch.allclose(one, want[:1], rtol=2e-2, atol=2e-2 * float(want.abs().max()))
        assert torch.allclose(two, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))
        if head.covered:  # The embedding is looked up from the blocks, in the model's dtype.
            assert runner.embed is None and runner.embed_blocks is not None
        else:  # no packed bf16 form on this CPU (oneDNN's needs AVX-512 or AVX-NE-CONVERT): the float copy stays
            assert head.kernel_for(64) == "torch" and runner.embed is not None
        assert [len(tokens) for tokens in greedy_tokens(engine, [[5, 9, 11, 40]], [6])] == [6]
    finally:
        engine.shutdown(timeout=10)
