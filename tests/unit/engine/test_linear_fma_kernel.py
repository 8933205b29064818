"""The panel-packed float32 linear kernel (inference/engine/kernels/linear_fma.c, packed by linear_fma_pack.c): its
packing is the layout it claims, it matches F.linear (and LlamaMLP's SiLU-and-multiply) for every row-block and
row-chunk tail and the widths its blocks do not divide, it refuses what it does not take, and a float32 runner on such
a CPU uses it in place of oneDNN for every step past the few-rows kernels."""

import copy

import pytest
import torch
import torch.nn.functional as F

from inference.engine import block_quant
from inference.engine.kernels import linear_fma
from inference.engine.kv_cache import KVCache
from inference.engine.loader import cpu_has_avx512
from inference.engine.runner import ModelRunner, StepBatch
from tests.unit.engine.helpers import gguf_roundtrip, needs_gcc

pytestmark = needs_gcc


@pytest.fixture(scope="module")
def kernel():
    found = linear_fma()
    if found is None:
        pytest.skip("this CPU has no AVX2 and FMA")
    return found


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    # float32 sums in another order than MKL's: a few float32 ulps of the largest output apart.
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max().clamp(min=1.0)))


def test_the_panel_width_is_the_vector_width(kernel):
    assert kernel.panel == (16 if cpu_has_avx512() else 8)


def test_packing_is_the_panel_layout(kernel):
    p = kernel.panel
    n, k = 6 * p, 40
    w = torch.randn(n, k)
    assert torch.equal(kernel.pack(w), w.view(n // p, p, k).transpose(1, 2).reshape(n, k))
    # swiglu: gate panel j, then up panel j
    gate, up = w[: n // 2], w[n // 2 :]
    interleaved = torch.stack([gate.view(n // (2 * p), p, k), up.view(n // (2 * p), p, k)], 1).reshape(n, k)
    want = interleaved.view(n // p, p, k).transpose(1, 2).reshape(n, k)
    assert torch.equal(kernel.pack(w, swiglu=True), want)


# n in panels: 120 = 60 blocks of two; 9 leaves a last block of one panel, 1 is that panel alone. k: any width.
# m: every row-block tail (blocks of 6 with AVX2, 12 with AVX-512), and past one chunk of 96 rows (97, 200).
@pytest.mark.parametrize(("panels", "k"), [(120, 576), (9, 1536), (1, 3)])
@pytest.mark.parametrize("m", [1, 5, 6, 7, 11, 12, 13, 32, 97, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_f_linear(kernel, panels, k, m, with_bias):
    n = panels * kernel.panel
    gen = torch.Generator().manual_seed(n + m)
    w = torch.randn(n, k, generator=gen)
    bias = torch.randn(n, generator=gen) if with_bias else None
    x = torch.randn(m, k, generator=gen)

    got = kernel(x, kernel.pack(w), bias)

    assert got.shape == (m, n) and got.dtype == torch.float32
    close(got, F.linear(x, w, bias))


def test_no_rows_give_no_rows(kernel):
    w = torch.randn(32, 64)
    assert kernel(torch.empty(0, 64), kernel.pack(w), None).shape == (0, 32)


@pytest.mark.parametrize(("inter", "k"), [(1536, 576), (None, 64)])  # None: 3 panels
@pytest.mark.parametrize("m", [1, 7, 13, 32, 100])
def test_swiglu_epilogue_matches_silu_times_up(kernel, inter, k, m):
    inter = inter or 3 * kernel.panel
    gen = torch.Generator().manual_seed(inter + m)
    w = torch.randn(2 * inter, k, generator=gen) * 0.1
    x = torch.randn(m, k, generator=gen)

    got = kernel(x, kernel.pack(w, swiglu=True), None, swiglu=True)

    gu = F.linear(x, w)
    assert got.shape == (m, inter) and got.dtype == torch.float32
    close(got, F.silu(gu[:, :inter]) * gu[:, inter:])


def test_swiglu_of_a_very_negative_gate_is_zero_not_nan(kernel):
    # exp(-g) overflows for g < -88; silu(g) * u must still be silu's limit, 0, for any finite up value.
    w = torch.zeros(32, 16)
    w[:16, 0] = 1.0  # gate = x[:, 0]
    w[16:, 1] = 1.0  # up = x[:, 1]
    x = torch.zeros(3, 16)
    x[:, 0] = torch.tensor([-100.0, -3e38, -87.0])
    x[:, 1] = torch.tensor([5.0, -3e38, 1e30])
    got = kernel(x, kernel.pack(w, swiglu=True), None, swiglu=True)
    want = F.silu(x[:, :1]) * x[:, 1:2]
    assert torch.isfinite(got).all() and torch.equal(got[:2], torch.zeros(2, 16))
    torch.testing.assert_close(got[2], want[2].expand(16), rtol=1e-4, atol=0)


def test_refuses_what_it_does_not_take(kernel):
    w = torch.randn(32, 64)
    packed = kernel.pack(w)
    with pytest.raises(ValueError):
        kernel.pack(torch.randn(36, 64))  # out-features not a multiple of the panel
    with pytest.raises(ValueError):
        kernel.pack(torch.randn(24, 64), swiglu=True)  # gate/up not whole panels each
    with pytest.raises(ValueError):
        kernel.pack(torch.randn(32, 64).bfloat16())  # bf16
    with pytest.raises(ValueError):
        kernel(torch.randn(2, 64).bfloat16(), packed, None)  # bf16 input
    with pytest.raises(ValueError):
        kernel(torch.randn(2, 48), packed, None)  # in-features differ
    with pytest.raises(ValueError):
        kernel(torch.randn(2, 64), packed, torch.randn(32), swiglu=True)  # no bias there
    with pytest.raises(ValueError):
        kernel(torch.randn(2, 64), packed, torch.randn(16))  # bias of the wrong width


def float32_runner(model, kernel_memory: str = "fast") -> ModelRunner:
    cfg = model.config
    kv = KVCache(
        cfg.num_hidden_layers, cfg.num_key_value_heads, 16, 2, 64, 128, torch.float32, torch.device("cpu")
    )
    return ModelRunner(copy.deepcopy(model), kv, max_positions=64, kernel_memory=kernel_memory)


def test_a_float32_runner_takes_every_large_step_through_the_kernel(kernel, tiny_loaded):
    model = tiny_loaded.model
    runner = float32_runner(model)
    linears = [runner.lm_head, *(getattr(lw, p) for lw in runner.layers for p in ("qkv", "o", "down"))]
    assert all(linear.kernel_for(40) == "linear_fma" and not linear.packed for linear in linears)
    assert all(lw.gate_up.kernel_for(40) == "linear_fma_swiglu" for lw in runner.layers)
    assert all(lw.gate_up.linear is None for lw in runner.layers)  # no [2I]-wide copy besides the gated one

    tokens = list(range(300, 340))
    batch = StepBatch(
        token_ids=tokens, positions=list(range(40)), slots=[1] * 40, prefills=[(1, 0, 40)], logit_rows=[39]
    )
    with torch.inference_mode():
        got = runner.forward(batch)[0]  # 40 prompt rows: through the kernel, prefill and lm_head alike
        want = model(torch.tensor([tokens])).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))


def block_weight(
    n: int, k: int, seed: int, kind: str = "q8_0"
) -> tuple[torch.Tensor, block_quant.BlockWeight]:
    """A float32 ``[n, k]`` weight that is exactly ``kind`` values (as the loader's checkpoint of a GGUF) and its
    blocks."""
    w = gguf_roundtrip(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)), kind)
    blocks = block_quant.recover(w)
    assert blocks is not None and blocks.kind == kind
    return w, blocks


def test_q8_packing_is_the_panel_layout(kernel):
    p = kernel.panel
    n, k = 3 * p, 64
    _, blocks = block_weight(n, k, 1)
    packed = kernel.pack_blocks(blocks)
    assert packed.kind == "q8_0" and packed.mp is None
    assert torch.equal(packed.qp, blocks.qs.view(n // p, p, k).transpose(1, 2).reshape(n, k))
    assert torch.equal(packed.dp, blocks.d.view(n // p, p, k // 32).transpose(1, 2).reshape(n, k // 32))


def unpack_q4_1(blocks: block_quant.BlockWeight) -> torch.Tensor:
    """The 4-bit values of Q4_1 blocks as uint8 ``[n, k]`` in input order (GGUF: byte j of a block holds input j low,
    input j + 16 high)."""
    n, nb = blocks.d.shape
    qs = blocks.qs.view(n, nb, 16)
    return torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(n, nb * 32)


@pytest.mark.parametrize("swiglu", [False, True])
def test_q4_1_packing_is_the_panel_layout(kernel, swiglu):
    p, half = kernel.panel, kernel.panel // 2
    n, k = 4 * p, 64
    _, blocks = block_weight(n, k, 3, "q4_1")
    packed = kernel.pack_blocks(blocks, swiglu=swiglu)
    q, d, mn = unpack_q4_1(blocks), blocks.d, blocks.mn
    if swiglu:  # gate panel j, then up panel j
        order = torch.arange(n).view(2, n // (2 * p), p).transpose(0, 1).reshape(n)
        q, d, mn = q[order], d[order], mn[order]
    panels = q.view(n // p, p, k).transpose(1, 2)  # [panels, k, p]
    want = panels[:, :, :half] | (panels[:, :, half:] << 4)  # column c low, column c + p / 2 high
    assert packed.kind == "q4_1" and packed.swiglu == swiglu
    assert torch.equal(packed.qp.view(n // p, k, half), want)
    assert torch.equal(packed.dp, d.view(n // p, p, k // 32).transpose(1, 2).reshape(n, k // 32))
    assert torch.equal(packed.mp, mn.view(n // p, p, k // 32).transpose(1, 2).reshape(n, k // 32))


# n in panels: 9 leaves a last column block of one panel, 1 is that panel alone; m: row-block tails and past a 96-row
# chunk.
@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
@pytest.mark.parametrize(("panels", "k"), [(60, 576), (9, 1536), (1, 32)])
@pytest.mark.parametrize("m", [1, 5, 7, 13, 32, 97])
@pytest.mark.parametrize("with_bias", [False, True])
def test_block_panels_are_bit_for_bit_the_float_panels_of_the_same_weight(
    kernel, kind, panels, k, m, with_bias
):
    n = panels * kernel.panel
    w, blocks = block_weight(n, k, n + m, kind)
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen) if with_bias else None

    got = kernel.call_blocks(x, kernel.pack_blocks(blocks), bias)

    assert got.shape == (m, n) and got.dtype == torch.float32
    assert torch.equal(got, kernel(x, kernel.pack(w), bias))  # same weights, same order of sums
    close(got, F.linear(x, w, bias))


@pytest.mark.parametrize("m", [1, 7, 13, 32, 100])
def test_q4_1_swiglu_is_bit_for_bit_the_float_panels_of_the_same_weight(kernel, m):
    inter, k = 1536, 576
    w, blocks = block_weight(2 * inter, k, m, "q4_1")
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))

    got = kernel.call_blocks(x, kernel.pack_blocks(blocks, swiglu=True), None)

    assert got.shape == (m, inter)
    assert torch.equal(got, kernel(x, kernel.pack(w, swiglu=True), None, swiglu=True))
    gu = F.linear(x, w)
    close(got, F.silu(gu[:, :inter]) * gu[:, inter:])


def test_block_panels_refuse_what_they_do_not_take(kernel):
    p = kernel.panel
    _, q8 = block_weight(2 * p, 64, 2)
    _, q4 = block_weight(2 * p, 64, 2, "q4_1")
    assert not kernel.supports_blocks(None)
    assert not kernel.supports_blocks(q8, swiglu=True)  # Q8_0 has no gated form
    assert kernel.supports_blocks(q4, swiglu=True)
    _, odd = block_weight(3 * p, 64, 2, "q4_1")  # 3 panels: no gate/up pairs
    assert kernel.supports_blocks(odd) and not kernel.supports_blocks(odd, swiglu=True)
    with pytest.raises(ValueError):
        kernel.pack_blocks(odd, swiglu=True)
    for packed in (kernel.pack_blocks(q8), kernel.pack_blocks(q4)):
        zero_rows = kernel.call_blocks(torch.randn(0, 64), packed, None)
        assert zero_rows.shape == (0, 2 * p)  # zero rows in, zero rows out
        with pytest.raises(ValueError):
            kernel.call_blocks(torch.randn(2, 32), packed, None)  # in-features differ
        with pytest.raises(ValueError):
            kernel.call_blocks(torch.randn(2, 64).bfloat16(), packed, None)
        with pytest.raises(ValueError):
            kernel.call_blocks(torch.randn(2, 64), packed, torch.randn(p))  # bias of the wrong width
    gated = kernel.pack_blocks(q4, swiglu=True)
    with pytest.raises(ValueError):
        kernel.call_blocks(torch.randn(2, 64), gated, torch.randn(2 * p))  # no bias with the SiLU epilogue


def test_a_float32_runner_reads_a_q8_lm_head_from_its_blocks(kernel, tiny_loaded):
    model = copy.deepcopy(tiny_loaded.model)
    with torch.no_grad():
        head = model.lm_head.weight
        head.copy_(gguf_roundtrip(head[:, : head.shape[1] // 32 * 32], "q8_0"))  # tiny model: 64 inputs
    # "low": the block panels wherever a weight has blocks, on every CPU kind (on an AVX2 CPU "fast" takes the
    # measured faster float panels: kernels/table.py).
    runner = float32_runner(model, kernel_memory="low")
    assert runner.lm_head.kernel_for(40) == "linear_fma_blocks" and runner.lm_head.block_weight.kind == "q8_0"
    assert all(
        lw.qkv.kernel_for(40) == "linear_fma" for lw in runner.layers
    )  # random float weights: no blocks

    tokens = list(range(300, 340))
    batch = StepBatch(
        token_ids=tokens,
        positions=list(range(40)),
        slots=[1] * 40,
        prefills=[(1, 0, 40)],
        logit_rows=list(range(40)),
    )
    with torch.inference_mode():
        got = runner.forward(batch)  # 40 rows of logits: past the few-rows kernels, through the Q8 panels
        want = model(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))


def test_a_float32_runner_reads_q4_1_layers_from_their_blocks(kernel, tiny_loaded):
    model = copy.deepcopy(tiny_loaded.model)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (
                *(getattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")),
                *(getattr(layer.mlp, n) for n in ("gate_proj", "up_proj", "down_proj")),
            ):
                proj.weight.copy_(gguf_roundtrip(proj.weight, "q4_1"))  # as a GGUF's Q4_1 layers load
    runner = float32_runner(model, kernel_memory="low")  # the block panels on every CPU kind, as above
    for lw in runner.layers:
        assert all(getattr(lw, p).block_weight.kind == "q4_1" for p in ("qkv", "o", "down"))
        assert all(getattr(lw, p).kernel_for(40) == "linear_fma_blocks" for p in ("qkv", "o", "down"))
        assert lw.gate_up.kernel_for(40) == "linear_fma_blocks_swiglu"  # gate/up: one Q4_1 pass with the SiLU

    tokens = list(range(300, 340))
    batch = StepBatch(
        token_ids=tokens, positions=list(range(40)), slots=[1] * 40, prefills=[(1, 0, 40)], logit_rows=[39]
    )
    with torch.inference_mode():
        got = runner.forward(batch)[0]  # 40 prompt rows: through the Q4_1 panels
        want = model(torch.tensor([tokens])).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))
