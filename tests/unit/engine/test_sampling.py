"""Batched sampler: per-row parameters, greedy semantics, top-k/top-p, penalties, seeds."""

from __future__ import annotations

import torch

from inference.engine import SamplingParams
from inference.engine.sampling import TOP_P_CANDIDATES, SamplerState, apply_penalties, sample_next_tokens


def _states(*params):
    return [SamplerState.create(p, prompt_ids=[1, 2, 3]) for p in params]


def test_greedy_is_argmax_with_first_index_on_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 0.0, 5.0]])
    assert sample_next_tokens(
        logits, _states(SamplingParams(temperature=0), SamplingParams(temperature=0))
    ) == [1, 0]


def test_per_row_params_in_one_batch():
    torch.manual_seed(0)
    logits = torch.randn(4, 1000) * 3
    states = _states(
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, top_k=1),  # top-k 1 == greedy
        SamplingParams(temperature=1.0, top_p=1e-6),  # nucleus of one token == greedy
        SamplingParams(temperature=0.01, seed=5),  # almost greedy
    )
    best = logits.argmax(-1).tolist()
    assert sample_next_tokens(logits.clone(), states) == best


def test_top_k_restricts_support_and_top_p_follows_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    gen = torch.Generator().manual_seed(0)
    k2 = sample_next_tokens(logits.clone(), _states(*[SamplingParams(top_k=2)] * 4000), gen)
    assert set(k2) == {0, 1}
    assert abs(k2.count(0) / 4000 - 0.5 / 0.8) < 0.03
    p = sample_next_tokens(logits.clone(), _states(*[SamplingParams(top_p=0.75)] * 4000), gen)
    assert set(p) == {0, 1}  # 0.5 < 0.75, 0.5 + 0.3 reaches it
    full = sample_next_tokens(logits.clone(), _states(*[SamplingParams()] * 4000), gen)
    assert abs(full.count(3) / 4000 - 0.05) < 0.015


def test_top_p_falls_back_to_full_sort_when_candidates_do_not_cover_mass():
    vocab = TOP_P_CANDIDATES * 8
    logits = torch.zeros(2000, vocab)  # uniform: top-256 covers only 1/8 of the mass
    out = sample_next_tokens(
        logits, _states(*[SamplingParams(top_p=0.5)] * 2000), torch.Generator().manual_seed(1)
    )
    assert max(out) >= TOP_P_CANDIDATES  # tokens outside the candidate set are reachable


def test_seeded_rows_do_not_depend_on_neighbours():
    torch.manual_seed(1)
    row = torch.randn(1, 500)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=42)
    st = _states(params)
    seq_alone = [sample_next_tokens(row.clone(), st)[0] for _ in range(20)]
    st2 = _states(params)
    seq_mixed = []
    for i in range(20):
        others = _states(SamplingParams(temperature=1.0, top_k=3 + i), SamplingParams(temperature=0))
        batch = torch.cat([torch.randn(1, 500), row, torch.randn(1, 500)])
        seq_mixed.append(sample_next_tokens(batch, [others[0], st2[0], others[1]])[1])
    assert seq_alone == seq_mixed
    assert len(set(seq_alone)) > 1  # it really sampled


def test_penalties():
    logits = torch.tensor([[2.0, 1.9, -1.0, 0.5]])
    rep = SamplerState.create(SamplingParams(temperature=0, repetition_penalty=2.0), prompt_ids=[0])
    assert sample_next_tokens(logits.clone(), [rep]) == [1]  # token 0 (in prompt) 2.0 -> 1.0
    freq = SamplerState.create(SamplingParams(temperature=0, frequency_penalty=1.0), prompt_ids=[])
    assert sample_next_tokens(logits.clone(), [freq]) == [0]
    freq.record(0, 4)
    assert sample_next_tokens(logits.clone(), [freq]) == [1]  # 2.0 - 1.0 < 1.9
    pres = SamplerState.create(SamplingParams(temperature=0, presence_penalty=0.08), prompt_ids=[])
    freq2 = SamplerState.create(SamplingParams(temperature=0, frequency_penalty=0.08), prompt_ids=[])
    for state in (pres, freq2):
        state.record(0, 4)
        state.record(0, 4)
    assert sample_next_tokens(logits.clone(), [pres]) == [0]  # presence counts once: 1.92 > 1.9
    assert sample_next_tokens(logits.clone(), [freq2]) == [1]  # frequency counts twice: 1.84


def _mask_penalised(row: torch.Tensor, seen: list[int], penalty: float) -> torch.Tensor:
    """The repetition penalty as a vocabulary-wide mask (the per-row form the batched one replaced)."""
    mask = torch.zeros(row.shape[0], dtype=torch.bool)
    mask[seen] = True
    return torch.where(mask, torch.where(row > 0, row / penalty, row * penalty), row)


def test_repetition_penalty_batched_matches_per_row_mask():
    torch.manual_seed(3)
    vocab = 300
    logits = torch.randn(5, vocab) * 4
    prompts = [[1, 2, 2, 299], [], [7, 400, -1], [5] * 10, [0, 1, 2]]  # duplicates and out-of-range ids
    penalties = [1.3, 1.1, 0.8, 1.0, 2.0]  # 1.0: no repetition penalty on that row
    outputs = [[2, 3, 3], [9], [7, 8], [4], []]
    states = []
    for prompt, penalty, output in zip(prompts, penalties, outputs, strict=True):
        state = SamplerState.create(SamplingParams(temperature=0, repetition_penalty=penalty), prompt)
        state.seen_index(vocab)  # built at the first step, then extended by the outputs
        for token in output:
            state.record(token, vocab)
        states.append(state)
    got = logits.clone()
    apply_penalties(got, states)
    for i, (prompt, penalty, output) in enumerate(zip(prompts, penalties, outputs, strict=True)):
        seen = sorted({t for t in prompt + output if 0 <= t < vocab})
        expected = _mask_penalised(logits[i], seen, penalty) if penalty != 1.0 else logits[i]
        assert torch.equal(got[i], expected), i
    assert states[0].seen_index(vocab).tolist() == [1, 2, 299, 3]  # each id once, in the order first seen


def test_repetition_penalty_before_the_first_step_and_with_presence():
    # Tokens recorded before the index exists (and already in the prompt) count once; presence stacks on top.
    state = SamplerState.create(
        SamplingParams(temperature=0, repetition_penalty=2.0, presence_penalty=0.5), prompt_ids=[0]
    )
    state.record(0, 4)
    state.record(1, 4)
    logits = torch.tensor([[2.0, 4.0, -1.0, 0.5]])
    apply_penalties(logits, [state])
    assert logits.tolist() == [[1.0 - 0.5, 2.0 - 0.5, -1.0, 0.5]]
    assert sorted(state.seen_index(4).tolist()) == [0, 1]


def test_penalties_on_non_contiguous_logits():
    base = torch.tensor([[2.0, 9.0], [1.9, 9.0], [-1.0, 9.0], [0.5, 9.0]]).t()  # rows are strided views
    logits = base[:1]
    assert not logits.is_contiguous()
    rep = SamplerState.create(SamplingParams(temperature=0, repetition_penalty=2.0), prompt_ids=[0])
    assert sample_next_tokens(logits, [rep]) == [1]
