"""Shared helpers for the engine tests: reference generation and event collection."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from inference.engine import FinishEvent, LLMEngine, RequestHandle, SamplingParams, TokenEvent

#: Skips a test (or, as ``pytestmark``, a module) of the native kernels where they cannot be built.
needs_gcc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("gcc") is None, reason="needs Linux and gcc"
)

# A divergence between engine and reference is only acceptable at a numeric near-tie.
NEAR_TIE = 1e-3


def reference_greedy(model, prompt: list[int], max_new_tokens: int, eos_ids) -> list[int]:
    """``model.generate(do_sample=False)`` for one prompt; returns new tokens (EOS included)."""
    eos = list(eos_ids)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0],
        )
    tokens = out[0, len(prompt) :].tolist()
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def collect(handle: RequestHandle, timeout: float = 60.0) -> tuple[list[TokenEvent], FinishEvent]:
    events = list(handle.events(timeout=timeout))
    finish = events[-1]
    assert isinstance(finish, FinishEvent)
    tokens = events[:-1]
    assert all(isinstance(e, TokenEvent) for e in tokens)
    assert [e.seq for e in tokens] == list(range(len(tokens)))
    assert "".join(e.text for e in tokens) == finish.text
    return tokens, finish


def event_tokens(events: list[TokenEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]


def top2_gap(model, tokens: list[int]) -> tuple[float, int, int]:
    """Reference next-token logit gap between the best and second-best token after ``tokens``."""
    with torch.inference_mode():
        logits = model(torch.tensor([tokens])).logits[0, -1].float()
    vals, idx = logits.topk(2)
    return float(vals[0] - vals[1]), int(idx[0]), int(idx[1])


def assert_greedy_equal(model, prompt, got_tokens, ref_tokens, eos_ids, finish: FinishEvent) -> None:
    """Engine greedy output must equal the reference, except after a proven near-tie."""
    eos = set(eos_ids)
    ref_visible = [t for t in ref_tokens if t not in eos]
    if got_tokens == ref_visible:
        expected_reason = "stop" if ref_tokens and ref_tokens[-1] in eos else "length"
        assert finish.finish_reason == expected_reason
        assert finish.usage.completion_tokens == len(ref_tokens)
        return
    i = next(
        (k for k, (a, b) in enumerate(zip(got_tokens, ref_visible, strict=False)) if a != b),
        min(len(got_tokens), len(ref_visible)),
    )
    gap, best, second = top2_gap(model, list(prompt) + ref_visible[:i])
    assert gap < NEAR_TIE and {best, second} >= {ref_visible[i] if i < len(ref_visible) else best}, (
        f"engine diverged from model.generate at output token {i}: got {got_tokens[i : i + 5]}, "
        f"expected {ref_visible[i : i + 5]}; top-2 logit gap there is {gap:.3g} (not a near-tie)"
    )
    print(f"near-tie at output token {i}: top-2 logit gap {gap:.3g} (tokens {best} vs {second})")


def greedy_tokens(engine: LLMEngine, prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """Submit every prompt at once (greedy, exactly ``lengths[i]`` new tokens), run the engine until idle and
    return each request's token ids."""
    handles = [
        engine.submit(p, SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True))
        for p, n in zip(prompts, lengths, strict=True)
    ]
    engine.run_until_idle()
    return [[t for e in collect(h)[0] for t in e.token_ids] for h in handles]


KINDS = {"q4_1": GGMLQuantizationType.Q4_1, "q8_0": GGMLQuantizationType.Q8_0}


def gguf_roundtrip(weight: torch.Tensor, kind: str) -> torch.Tensor:
    """``weight`` quantized and dequantized by gguf-py (what the loader's float32 copy of a GGUF holds)."""
    qtype = KINDS[kind]
    blocks = quants.quantize(weight.detach().numpy().astype(np.float32), qtype)
    return torch.from_numpy(np.ascontiguousarray(quants.dequantize(blocks, qtype))).float()


def record_calls(op, name: str, calls: list[int]) -> None:
    """Make the bands of ``op`` (a runner ``Linear`` or ``GatedUp``) served by the implementation ``name`` append each
    call's row count to ``calls`` before running as they did."""

    def recording(fn):
        return lambda x, *rest: calls.append(x.shape[0]) or fn(x, *rest)

    op.bands = [(upto, k, recording(fn) if k.name == name else fn) for upto, k, fn in op.bands]
