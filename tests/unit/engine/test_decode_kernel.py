"""The native decode-attention kernel (inference/engine/kernels): builds here, matches SDPA, and leaves the
engine's greedy output unchanged."""

import shutil
import sys

import pytest
import torch
import torch.nn.functional as F

from inference.engine import SamplingParams
from inference.engine.kernels import decode_attention
from tests.unit.engine.helpers import collect

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("gcc") is None, reason="needs Linux and gcc"
)


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


def test_engine_greedy_output_is_the_same_with_the_kernel_and_with_sdpa(make_engine):
    prompts = [[5 + i, 9, 11 + 2 * i, 40] * (1 + i) for i in range(5)]
    params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
    outputs = {}
    for native in (True, False):
        engine = make_engine(native_kernels=native)
        assert (engine._runner.decode_kernel is not None) is native
        handles = [engine.submit(p, params) for p in prompts]
        engine.run_until_idle()
        outputs[native] = [[t for e in collect(h)[0] for t in e.token_ids] for h in handles]
    assert outputs[True] == outputs[False]
    assert all(len(tokens) == 24 for tokens in outputs[True])
