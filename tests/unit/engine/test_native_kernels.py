"""The native CPU kernels (inference/engine/kernels): they build here, decode attention matches SDPA, the
few-rows linear matches F.linear, and the engine's greedy output is the same with them and without."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from inference.engine import SamplingParams
from inference.engine.kernels import decode_attention, elementwise, linear_rows
from tests.unit.engine.helpers import collect, greedy_tokens, needs_gcc

pytestmark = needs_gcc


def reference(q, k_cache, v_cache, slots, lens):
    """Per-row SDPA over exactly each row's cached positions, in float32."""
    rows = []
    for i, (s, n) in enumerate(zip(slots.tolist(), lens.tolist(), strict=True)):
        rows.append(
            F.scaled_dot_product_attention(
                q[i : i + 1].float(), k_cache[s : s + 1, :, :n].float(), v_cache[s : s + 1, :, :n].float()
            )
        )
    return torch.cat(rows)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("nkv", "rep", "hd"), [(3, 3, 64), (2, 2, 16), (1, 4, 128), (2, 5, 32)])
def test_kernel_matches_sdpa_on_shuffled_slots_and_ragged_lengths(dtype, nkv, rep, hd):
    kernel = decode_attention()
    assert kernel is not None and kernel.supports(dtype, head_dim=hd, n_rep=rep)
    gen = torch.Generator().manual_seed(hd * rep)
    slots_total, slot_len = 9, 300
    k_cache = torch.randn(slots_total, nkv, slot_len, hd, generator=gen).to(dtype)
    v_cache = torch.randn(slots_total, nkv, slot_len, hd, generator=gen).to(dtype)
    slots = torch.tensor([7, 0, 3, 8, 2], dtype=torch.long)
    lens = torch.tensor([1, slot_len, 17, 129, 256], dtype=torch.long)
    q = torch.randn(len(slots), nkv, rep, hd, generator=gen).to(dtype)

    got = kernel(q, k_cache, v_cache, slots, lens, hd**-0.5)

    assert got.shape == q.shape and got.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), reference(q, k_cache, v_cache, slots, lens), rtol=tol, atol=tol)
    torch.testing.assert_close(got[0].float(), v_cache[7, :, :1].float().expand(nkv, rep, hd), rtol=0, atol=0)


def test_kernel_refuses_bad_input_with_value_error():
    kernel = decode_attention()
    assert kernel is not None
    q = torch.randn(2, 3, 3, 64)
    cache = torch.randn(4, 3, 50, 64)
    slots = torch.tensor([0, 1])
    with pytest.raises(ValueError):
        kernel(q, cache, cache, slots, torch.tensor([0, 5]), 0.125)  # a length below 1
    with pytest.raises(ValueError):
        kernel(q, cache, cache, slots, torch.tensor([5, 51]), 0.125)  # beyond the slot
    with pytest.raises(ValueError):
        kernel(q, cache, cache, torch.tensor([0, 4]), torch.tensor([5, 5]), 0.125)  # no such slot
    with pytest.raises(ValueError):
        kernel(q.half(), cache.half(), cache.half(), slots, torch.tensor([5, 5]), 0.125)  # float16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_rows_matches_f_linear(dtype, rows, with_bias):
    kernel = linear_rows()
    gen = torch.Generator().manual_seed(rows)
    weight = (torch.randn(1000, 576, generator=gen) * 0.05).to(dtype)  # 1000: not a multiple of the block
    bias = torch.randn(1000, generator=gen).to(dtype) if with_bias else None
    x = torch.randn(rows, 576, generator=gen).to(dtype)
    assert kernel is not None and kernel.supports(weight)

    got = kernel(x, weight, bias)

    want = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert got.shape == (rows, 1000) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


def test_linear_rows_refuses_what_it_does_not_take():
    kernel = linear_rows()
    assert kernel is not None
    weight = torch.randn(32, 64)
    with pytest.raises(ValueError):
        kernel(torch.randn(kernel.MAX_ROWS + 1, 64), weight, None)  # too many rows
    with pytest.raises(ValueError):
        kernel(torch.randn(1, 64).bfloat16(), weight, None)  # mixed dtypes
    assert not kernel.supports(torch.randn(32, 40))  # in-features not a multiple of 16
    assert not kernel.supports(torch.randn(64, 32).t())  # not contiguous


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 200])  # one thread / split over the OpenMP threads
def test_elementwise_kernels_match_torch(dtype, rows):
    kernels = elementwise()
    assert kernels is not None
    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 576, generator=gen) * 4).to(dtype)
    weight = torch.randn(576, generator=gen).to(dtype)
    gate_up = (torch.randn(rows, 2 * 1536, generator=gen) * 3).to(dtype)

    normed = kernels.rms_norm(x, weight, 1e-5)
    act = kernels.silu_mul(gate_up)

    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    want_norm = weight * F.rms_norm(x.float(), (576,), eps=1e-5).to(dtype)
    want_act = F.silu(gate_up[:, :1536]) * gate_up[:, 1536:]
    assert normed.dtype == dtype and act.shape == (rows, 1536) and act.dtype == dtype
    torch.testing.assert_close(normed, want_norm, rtol=tol, atol=tol)
    torch.testing.assert_close(act, want_act, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("rows", "added"), [(1, 1), (224, 200)]
)  # one thread / split; pad rows left as they are
def test_add_rms_norm_is_the_residual_add_then_rms_norm(dtype, rows, added):
    kernels = elementwise()
    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 576, generator=gen) * 4).to(dtype)
    delta = (torch.randn(added, 576, generator=gen) * 4).to(dtype)
    weight = torch.randn(576, generator=gen).to(dtype)
    want_x = x.clone()
    want_x[:added].add_(delta)  # torch's add_, rounded to the dtype

    normed = kernels.add_rms_norm(x, delta, weight, 1e-5)

    assert torch.equal(x, want_x)  # in place, bit for bit
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(normed, kernels.rms_norm(want_x, weight, 1e-5), rtol=tol, atol=tol)
    with pytest.raises(ValueError):
        kernels.add_rms_norm(x, torch.zeros(rows + 1, 576, dtype=dtype), weight, 1e-5)  # more rows than x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 40])  # one thread / split over the OpenMP threads
def test_argmax_is_torchs_with_ties_infinities_and_nan(dtype, rows):
    kernel = elementwise()
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 49152, generator=gen).to(dtype)
    x[0, 7] = x[0, 9000] = 50.0  # a tie: the first index
    if rows > 2:
        x[-1, :] = float("-inf")  # all -inf: index 0
        x[1, 123] = x[1, 40000] = float("nan")  # a NaN is the maximum; the first one
        x[2, 5] = float("inf")
        x[2, 6] = 0.0
    got = kernel.argmax(x)
    assert got.dtype == torch.int64 and torch.equal(got, x.argmax(-1))
    assert int(got[0]) == 7


def test_elementwise_kernels_refuse_what_they_do_not_take():
    kernels = elementwise()
    assert kernels is not None
    with pytest.raises(ValueError):
        kernels.rms_norm(torch.randn(2, 64), torch.randn(32), 1e-5)  # weight of another width
    with pytest.raises(ValueError):
        kernels.rms_norm(torch.randn(64, 2).t(), torch.randn(64), 1e-5)  # not contiguous
    with pytest.raises(ValueError):
        kernels.silu_mul(torch.randn(2, 63))  # odd width: no gate/up halves
    with pytest.raises(ValueError):
        kernels.silu_mul(torch.randn(2, 64).half())  # float16
    with pytest.raises(ValueError):
        kernels.argmax(torch.randn(4, 10).t())  # not contiguous
    with pytest.raises(ValueError):
        kernels.argmax(torch.randn(4, 0))  # nothing to choose from


def test_engine_greedy_output_is_the_same_with_the_kernels_and_without(make_engine):
    # Staggered lengths: steps of 5, 4, 3, 2 and finally 1 decoding sequence (the few-rows kernel's case).
    prompts = [[5 + i, 9, 11 + 2 * i, 40] * (1 + i) for i in range(5)]
    lengths = [6 + 5 * i for i in range(5)]
    outputs = {}
    for native in (True, False):
        engine = make_engine(native_kernels=native)
        assert (engine._runner.decode_kernel is not None) is native
        assert (engine._runner.lm_head.kernel_for(1) == "linear_rows") is native
        outputs[native] = greedy_tokens(engine, prompts, lengths)
    assert outputs[True] == outputs[False]
    assert [len(tokens) for tokens in outputs[True]] == lengths


def test_without_a_working_compiler_the_engine_warns_and_keeps_torchs_kernels(
    make_engine, monkeypatch, tmp_path, caplog
):
    from inference.engine import kernels

    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("INFERENCE_KERNEL_DIR", str(tmp_path))
    kernels.build.library.cache_clear()
    try:
        assert kernels.decode_attention() is None and kernels.linear_rows() is None
        assert "native kernels off" in caplog.text
        engine = make_engine()
        assert engine._runner.decode_kernel is None and engine._runner.lm_head.kernel_for(1) != "linear_rows"
        handle = engine.submit(
            [5, 9, 11, 40], SamplingParams(temperature=0.0, max_new_tokens=5, ignore_eos=True)
        )
        engine.run_until_idle()
        assert len([t for e in collect(handle)[0] for t in e.token_ids]) == 5
    finally:
        kernels.build.library.cache_clear()
    assert not list(tmp_path.glob("*.so"))


def test_a_build_from_scratch_compiles_every_source_and_caches_one_object(tmp_path):
    # What a new machine does on its first engine start (the sources compile side by side, then link).
    import ctypes

    from inference.engine import kernels
    from inference.engine.threads import loaded_libgomp_paths

    gomp = Path(loaded_libgomp_paths()[0])
    built = kernels.build.build(kernels.build.SOURCES, gomp, tmp_path)
    manifest = built.with_suffix(".json")
    assert built.parent == tmp_path and sorted(tmp_path.iterdir()) == [
        manifest,
        built,
    ]  # no temporary left behind
    lib = ctypes.CDLL(str(built))
    for symbol in (
        "decode_attention_bf16",
        "linear_rows_f32",
        "linear_q4_1_bf16",
        "linear_vnni_bf16",
        "linear_fma_f32",
        "argmax_f32",
    ):
        assert hasattr(lib, symbol)
    stamp = built.stat().st_mtime_ns
    assert kernels.build.build(kernels.build.SOURCES, gomp, tmp_path) == built  # cached: the same object
    assert built.stat().st_mtime_ns == stamp  # not rebuilt


def test_the_kernels_link_torchs_openmp_runtime_when_another_wheels_copy_loaded_first():
    # The GPU worker loads the safety guard chain (scikit-learn, which vendors its own libgomp) before the
    # engine: the kernels once linked that copy, the first in sorted order, and every decode step then ran
    # two OpenMP runtimes' spinning pools on 2 cores (24 ms per token instead of 11, docs/overhead.md).
    import subprocess
    import sys

    script = """
import sklearn.utils._openmp_helpers  # scikit-learn's own libgomp, loaded first as in the worker
import torch
from inference.engine.kernels import build
from inference.engine.threads import _libgomp_of, loaded_libgomp_paths, torch_libgomp_path
import os
torch.ones(8).sum()
paths = loaded_libgomp_paths()
assert len(paths) == 2 and "scikit_learn" in paths[0], paths
lib = build.library()
assert lib is not None
torch_dir = os.path.dirname(os.path.realpath(torch.__file__))
print(os.path.realpath(torch_libgomp_path()).startswith(torch_dir))
print(_libgomp_of(lib._name) == os.path.realpath(torch_libgomp_path()))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]
