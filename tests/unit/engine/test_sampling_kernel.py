"""The native sampling kernel (``kernels/sampling.c``): the torch path's draw for temperature, top-k and top-p rows,
the rows it leaves to the caller, and the engine's sampler with it and without."""

import pytest
import torch

from inference.engine import SamplingParams
from inference.engine.kernels import top_p_sampler
from inference.engine.sampling import (
    TOP_P_CANDIDATES,
    SamplerState,
    _sample_rows_torch,
    sample_next_tokens,
)
from tests.unit.engine.helpers import needs_gcc

pytestmark = needs_gcc


@pytest.fixture(scope="module")
def kernel():
    built = top_p_sampler()
    assert built is not None
    return built


def _both(kernel, logits, params, uniforms):
    """(native, torch) tokens for ``logits`` ``[R, V]`` with one ``SamplingParams`` per row."""
    rows, vocab = logits.shape
    states = [SamplerState.create(p, []) for p in params]
    native = kernel.sample(
        logits,
        torch.tensor([p.temperature for p in params]),
        torch.tensor([p.top_k if 0 < p.top_k < vocab else 0 for p in params]),
        torch.tensor([p.top_p for p in params]),
        uniforms,
        TOP_P_CANDIDATES,
    )
    return native, _sample_rows_torch(logits, states, uniforms)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_p=0.9),  # the chat's defaults
        SamplingParams(temperature=1.0, top_k=40, top_p=0.95),
        SamplingParams(temperature=0.5, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.5),
        SamplingParams(temperature=1.0),  # the whole vocabulary
    ],
)
def test_native_draw_is_the_torch_paths(kernel, params):
    # float32 logits with no ties: the same uniform picks the same token (the rare boundary where float rounding
    # differs aside).
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(64, 5000, generator=gen) * 4
    agree = total = 0
    for _ in range(20):
        uniforms = torch.rand(64, generator=gen)
        native, reference = _both(kernel, logits, [params] * 64, uniforms)
        assert (native >= 0).all()
        agree += int((native == reference).sum())
        total += 64
    assert agree >= total - 2


def test_native_draw_follows_the_nucleus_distribution(kernel):
    logits = torch.log(torch.tensor([[0.4, 0.25, 0.2, 0.1, 0.05] + [1e-9] * 300]))
    rows = 20000
    uniforms = torch.rand(rows, generator=torch.Generator().manual_seed(3))
    native, _ = _both(
        kernel, logits.repeat(rows, 1).contiguous(), [SamplingParams(top_p=0.8)] * rows, uniforms
    )
    counts = torch.bincount(native, minlength=5).tolist()
    assert sum(counts[:3]) == rows  # 0.4 + 0.25 < 0.8 <= 0.4 + 0.25 + 0.2: three tokens
    for token, p in enumerate([0.4 / 0.85, 0.25 / 0.85, 0.2 / 0.85]):
        assert abs(counts[token] / rows - p) < 0.015


def test_rows_the_candidates_cannot_decide_are_left_to_the_caller(kernel):
    vocab = TOP_P_CANDIDATES * 8
    logits = torch.zeros(3, vocab)  # uniform: no candidate set short of the whole row reaches top_p 0.5
    logits[1, 17] = 50.0  # one token holds all the mass: decided
    logits[2, 0] = float("nan")
    native = kernel.sample(
        logits,
        torch.ones(3),
        torch.zeros(3, dtype=torch.long),
        torch.full((3,), 0.5),
        torch.full((3,), 0.5),
        TOP_P_CANDIDATES,
    )
    assert native.tolist() == [-1, 17, -1]
    # The engine's sampler then takes those rows the torch way, with the same uniform each.
    states = [SamplerState.create(SamplingParams(top_p=0.5), []) for _ in range(2)]
    out = sample_next_tokens(
        logits[:2].clone(), states, torch.Generator().manual_seed(1), sampler=kernel.sample
    )
    assert out[1] == 17 and 0 <= out[0] < vocab


def test_seeded_rows_give_the_same_tokens_with_the_kernel_and_without(kernel):
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(6, 3000, generator=gen) * 3
    params = [
        SamplingParams(temperature=0.7, top_p=0.9, seed=1),
        SamplingParams(temperature=0),  # greedy beside sampled rows
        SamplingParams(temperature=1.0, top_k=20, seed=2),
        SamplingParams(temperature=0.9, seed=3),
        SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.2, seed=4),
        SamplingParams(temperature=1.1, top_p=0.3, seed=5),
    ]
    runs = []
    for sampler in (kernel.sample, None):
        states = [SamplerState.create(p, prompt_ids=[1, 2, 3]) for p in params]
        tokens = []
        for _ in range(10):
            step = sample_next_tokens(logits.clone(), states, sampler=sampler)
            for state, token in zip(states, step, strict=True):
                state.record(token, 3000)
            tokens.append(step)
        runs.append(tokens)
    assert runs[0] == runs[1]


def test_native_sampler_refuses_what_it_does_not_take(kernel):
    ones, zeros = torch.ones(2), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError):
        kernel.sample(torch.randn(2, 10).bfloat16(), ones, zeros, ones, ones * 0.5, 8)  # not float32
    with pytest.raises(ValueError):
        kernel.sample(torch.randn(10, 2).t(), ones, zeros, ones, ones * 0.5, 8)  # not contiguous
    with pytest.raises(ValueError):
        kernel.sample(
            torch.randn(2, 10), torch.ones(3), zeros, ones, ones * 0.5, 8
        )  # one temperature too many
    with pytest.raises(ValueError):
        kernel.sample(torch.randn(2, 10), ones, zeros, ones, ones * 0.5, 4096)  # too many candidates


def test_the_engine_samples_with_the_native_kernel(make_engine):
    engine = make_engine(native_kernels=True)
    assert engine._runner.sampler is not None
    assert make_engine(native_kernels=False)._runner.sampler is None


def test_engine_sampler_takes_strided_logits(kernel):
    logits = (
        torch.randn(300, 4, generator=torch.Generator().manual_seed(5)) * 3
    ).t()  # rows are strided views
    assert not logits.is_contiguous()
    states = [SamplerState.create(SamplingParams(temperature=0.8, top_p=0.9, seed=i), []) for i in range(4)]
    native = sample_next_tokens(logits, states, sampler=kernel.sample)
    states = [SamplerState.create(SamplingParams(temperature=0.8, top_p=0.9, seed=i), []) for i in range(4)]
    assert native == sample_next_tokens(logits, states)
