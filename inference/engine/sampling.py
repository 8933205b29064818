"""Sampling parameters and batched token selection with per-row parameters.

Each running request brings its own :class:`SamplingParams`; :func:`sample_next_tokens` picks
one token per logits row in a few batched tensor ops (greedy rows by ``argmax``; sampled rows
through a shared top-k/top-p candidate set) instead of one Python pass per request.

Reproducibility: a request with ``seed`` owns a ``torch.Generator`` and consumes exactly one
uniform number from it per generated token (inverse-CDF draw), and every quantity that
decides its token is computed from its own logits row only. So a seeded request produces the
same tokens whatever else shares the batch (up to float rounding differences in the logits
themselves), as in vLLM's per-request generators.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .errors import InvalidRequest

#: Size of the candidate set taken with ``topk`` for top-p sampling. A full-vocabulary sort of
#: 32 x 49152 logits costs ~60 ms on 2 CPU cores, ``topk(256)`` ~1 ms. When the top-256 tokens
#: do not reach ``top_p`` probability mass the row falls back to an exact full sort.
TOP_P_CANDIDATES = 256


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding parameters (OpenAI / vLLM semantics).

    Attributes:
        temperature: 0 means greedy (argmax); otherwise logits are divided by it. ``>= 0``.
        top_p: Nucleus sampling: keep the smallest set of most likely tokens whose probability
            mass reaches ``top_p``. ``0 < top_p <= 1``.
        top_k: Keep only the ``top_k`` most likely tokens; 0 disables. Applied before ``top_p``
            (``top_p`` then works on the renormalized top-k distribution, as in vLLM).
        repetition_penalty: CTRL / HF-style: logits of tokens already present in prompt or
            output are divided by it when positive, multiplied when negative. ``> 0``; 1 = off.
        presence_penalty: OpenAI-style, subtracted once from every token already generated.
            ``-2 <= x <= 2``.
        frequency_penalty: OpenAI-style, subtracted per occurrence in the output. ``-2..2``.
        seed: Makes sampling reproducible for this request, independent of batch composition.
        stop: Stop strings; generation ends *before* the first occurrence (not included in the
            output) with ``finish_reason="stop"``.
        max_new_tokens: Maximum number of generated tokens (``finish_reason="length"``). ``>= 1``.
        ignore_eos: Keep generating after EOS (EOS is then an ordinary token); for benchmarks,
            as in vLLM.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    max_new_tokens: int = 256
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # Accept a list (JSON bodies) but store a tuple so the dataclass stays hashable.
        if isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        elif isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def validate(self) -> None:
        """Check every field; raise :class:`InvalidRequest` naming the first bad one."""

        def finite(name: str, value: object) -> float:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise InvalidRequest(f"{name} must be a finite number, got {value!r}")
            return float(value)

        if finite("temperature", self.temperature) < 0:
            raise InvalidRequest(f"temperature must be >= 0, got {self.temperature}")
        top_p = finite("top_p", self.top_p)
        if not 0.0 < top_p <= 1.0:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequest(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if finite("repetition_penalty", self.repetition_penalty) <= 0:
            raise InvalidRequest(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = finite(name, getattr(self, name))
            if not -2.0 <= value <= 2.0:
                raise InvalidRequest(f"{name} must be in [-2, 2], got {value}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidRequest(f"seed must be an integer or None, got {self.seed!r}")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidRequest("stop must be a sequence of non-empty strings")
        mnt = self.max_new_tokens
        if isinstance(mnt, bool) or not isinstance(mnt, int) or mnt < 1:
            raise InvalidRequest(f"max_new_tokens must be an integer >= 1, got {mnt!r}")


@dataclass
class SamplerState:
    """Per-request mutable sampling state kept across steps.

    Attributes:
        params: The request's parameters.
        generator: Private RNG when ``params.seed`` is set.
        prompt_ids: Prompt token ids (only needed by ``repetition_penalty``).
        output_counts: ``[vocab]`` float32 occurrence counts of generated tokens, allocated lazily and only for
            requests with a presence or frequency penalty.
    """

    params: SamplingParams
    generator: torch.Generator | None = None
    prompt_ids: list[int] = field(default_factory=list)
    output_counts: torch.Tensor | None = None
    # repetition_penalty's token set (prompt and output, each id once): the ids as a tensor, the ids seen,
    # and the output ids seen since the tensor was last extended.
    _seen_index: torch.Tensor | None = None
    _seen: set[int] = field(default_factory=set)
    _seen_new: list[int] = field(default_factory=list)

    @classmethod
    def create(cls, params: SamplingParams, prompt_ids: list[int]) -> SamplerState:
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(params.seed)
        return cls(params=params, generator=gen, prompt_ids=prompt_ids if params.has_penalties else [])

    def record(self, token_id: int, vocab_size: int) -> None:
        """Account a generated token (for presence / frequency / repetition penalties)."""
        p = self.params
        if not p.has_penalties or not 0 <= token_id < vocab_size:
            return
        if p.repetition_penalty != 1.0 and token_id not in self._seen:
            self._seen.add(token_id)
            self._seen_new.append(token_id)
        if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
            if self.output_counts is None:
                self.output_counts = torch.zeros(vocab_size, dtype=torch.float32)
            self.output_counts[token_id] += 1.0

    def seen_index(self, vocab: int) -> torch.Tensor:
        """``[n]`` int64: the distinct token ids below ``vocab`` in the prompt and the output so far, the tokens
        ``repetition_penalty`` applies to. Kept across steps: a step adds only the output tokens it had not
        seen (one concatenation), not a vocabulary-sized mask."""
        if self._seen_index is None:
            prompt = {t for t in self.prompt_ids if 0 <= t < vocab}
            self._seen_new = [t for t in self._seen_new if t not in prompt]
            self._seen |= prompt
            self._seen_index = torch.tensor(sorted(prompt), dtype=torch.long)
        if self._seen_new:
            new = torch.tensor(self._seen_new, dtype=torch.long)
            self._seen_index = torch.cat([self._seen_index, new[new < vocab]])
            self._seen_new = []
        return self._seen_index


def apply_penalties(logits: torch.Tensor, states: list[SamplerState]) -> None:
    """Apply every row's penalties in place to contiguous ``[R, V]`` float32 ``logits`` (row ``i`` belongs to
    ``states[i]``).

    ``repetition_penalty`` (CTRL, Keskar et al. 2019, as ``transformers``' ``RepetitionPenaltyLogitsProcessor``:
    a seen token's logit is divided by it when positive, multiplied when not) for all rows at once: the seen ids
    of every row are gathered from the flattened logits, penalised and scattered back, so the work follows the
    number of seen tokens, not ``R x V``, in a fixed number of tensor operations whatever ``R`` is. Before, each
    row built a ``[V]`` mask in vocabulary-wide operations: 6.4 ms against 0.4 for 32 rows on one thread of a
    2-vCPU Xeon (``python -m devtools.bench.sampling_probe``, ``docs/engine.md``, "Sampling"). Presence and
    frequency penalties (OpenAI's) follow per row.
    """
    if not logits.is_contiguous():
        raise ValueError("apply_penalties needs contiguous logits (it writes through a flat view)")
    rows, vocab = logits.shape
    repeat = [i for i, s in enumerate(states) if s.params.repetition_penalty != 1.0]
    if repeat:
        ids = [states[i].seen_index(vocab) for i in repeat]
        lengths = torch.tensor([len(t) for t in ids])
        offsets = torch.tensor(repeat, dtype=torch.long) * vocab
        flat = torch.cat(ids) + torch.repeat_interleave(offsets, lengths)
        penalty = torch.repeat_interleave(
            torch.tensor([states[i].params.repetition_penalty for i in repeat], dtype=logits.dtype), lengths
        )
        view = logits.view(-1)
        values = view[flat]
        view[flat] = torch.where(values > 0, values / penalty, values * penalty)
    for i, s in enumerate(states):
        p = s.params
        if s.output_counts is not None and (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0):
            counts = s.output_counts[:vocab]
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def _draw(cum: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: first index whose cumulative (unnormalized) mass exceeds ``u * total``.

    ``cum``: ``[R, K]`` non-decreasing; ``uniforms``: ``[R]`` in [0, 1). Returns ``[R]`` indices.
    """
    target = uniforms * cum[:, -1]
    idx = torch.searchsorted(cum, target.unsqueeze(1), right=True).squeeze(1)
    return idx.clamp_(max=cum.shape[1] - 1)


def _uniforms(states: list[SamplerState], default_gen: torch.Generator | None) -> torch.Tensor:
    values = []
    shared_rows = [i for i, s in enumerate(states) if s.generator is None]
    shared = torch.rand(len(shared_rows), generator=default_gen) if shared_rows else None
    j = 0
    for s in states:
        if s.generator is None:
            values.append(shared[j])
            j += 1
        else:
            values.append(torch.rand((), generator=s.generator))
    return torch.stack(values)


#: A native sampler: ``(logits [R, V] float32, temperature [R], top_k [R] int64, top_p [R], uniforms [R], candidates)
#: -> [R] int64`` token ids, ``-1`` where the row must be sampled another way
#: (:meth:`inference.engine.kernels.TopPSampler.sample`).
NativeSampler = Callable[..., torch.Tensor]


def _sample_rows(
    logits: torch.Tensor,
    states: list[SamplerState],
    default_gen: torch.Generator | None,
    native: NativeSampler | None = None,
) -> torch.Tensor:
    """Sample one token for each row of ``logits`` (``[R, V]`` float32, temperature > 0): with ``native`` the rows
    it decides, the torch path the rest (each row's one uniform drawn here either way)."""
    uniforms = _uniforms(states, default_gen)
    if native is None:
        return _sample_rows_torch(logits, states, uniforms)
    vocab = logits.shape[1]
    out = native(
        logits.contiguous(),  # no copy when it already is
        torch.tensor([s.params.temperature for s in states], dtype=torch.float32),
        torch.tensor([s.params.top_k if 0 < s.params.top_k < vocab else 0 for s in states], dtype=torch.long),
        torch.tensor([s.params.top_p for s in states], dtype=torch.float32),
        uniforms,
        TOP_P_CANDIDATES,
    )
    rest = (out < 0).nonzero().flatten().tolist()
    if rest:
        sel = torch.tensor(rest)
        out[sel] = _sample_rows_torch(logits[sel], [states[i] for i in rest], uniforms[sel])
    return out


def _sample_rows_torch(
    logits: torch.Tensor, states: list[SamplerState], uniforms: torch.Tensor
) -> torch.Tensor:
    """:func:`_sample_rows` in torch ops, with each row's uniform given (``[R]``)."""
    rows, vocab = logits.shape
    temps = torch.tensor([s.params.temperature for s in states], dtype=torch.float32)
    top_k = [s.params.top_k if 0 < s.params.top_k < vocab else 0 for s in states]
    top_p = [s.params.top_p for s in states]
    x = logits / temps.unsqueeze(1)
    out = torch.empty(rows, dtype=torch.long)

    # Rows with neither top-k nor top-p sample from the full softmax; no sort is needed.
    full_rows = [i for i in range(rows) if top_k[i] == 0 and top_p[i] >= 1.0]
    cand_rows = [i for i in range(rows) if not (top_k[i] == 0 and top_p[i] >= 1.0)]
    if full_rows:
        sel = torch.tensor(full_rows)
        probs = torch.softmax(x[sel], dim=-1)
        out[sel] = _draw(probs.cumsum(-1), uniforms[sel])
    if not cand_rows:
        return out

    sel = torch.tensor(cand_rows)
    xc = x if len(cand_rows) == rows else x[sel]  # no copy of the whole batch when every row is a candidate
    kc = torch.tensor([top_k[i] for i in cand_rows])
    pc = torch.tensor([top_p[i] for i in cand_rows], dtype=torch.float32)
    k_cap = min(vocab, max(TOP_P_CANDIDATES, max(top_k[i] for i in cand_rows)))
    vals, idx = torch.topk(xc, k_cap, dim=-1)  # sorted descending
    probs = torch.exp(vals - torch.logsumexp(xc, dim=-1, keepdim=True))  # true softmax probs
    pos = torch.arange(k_cap).unsqueeze(0)
    has_k = kc > 0
    keep = (pos < torch.where(has_k, kc, k_cap).unsqueeze(1)).to(probs.dtype)
    probs = probs * keep
    # top-p works on the top-k renormalized distribution when top-k is set.
    denom = torch.where(has_k, probs.sum(-1), torch.ones_like(pc))
    cum = probs.cumsum(-1) / denom.unsqueeze(1)
    keep_p = (cum - probs / denom.unsqueeze(1)) < pc.unsqueeze(1)
    probs = probs * keep_p
    drawn = idx.gather(1, _draw(probs.cumsum(-1), uniforms[sel]).unsqueeze(1)).squeeze(1)
    # Without top-k the candidate set is only exact if it already reached top_p mass.
    exact = has_k | (cum[:, -1] >= pc)
    for j in (~exact).nonzero().flatten().tolist():
        i = cand_rows[j]
        svals, sidx = torch.sort(x[i], descending=True)
        sp = torch.softmax(svals, dim=-1)
        scum = sp.cumsum(-1)
        sp = sp * ((scum - sp) < top_p[i])
        k = _draw(sp.cumsum(-1).unsqueeze(0), uniforms[i : i + 1])
        drawn[j] = sidx[k[0]]
    out[sel] = drawn
    return out


def sample_next_tokens(
    logits: torch.Tensor,
    states: list[SamplerState],
    default_gen: torch.Generator | None = None,
    argmax: Callable[[torch.Tensor], torch.Tensor] | None = None,
    sampler: NativeSampler | None = None,
) -> list[int]:
    """Select the next token for every row.

    Args:
        logits: ``[R, V]`` next-token logits (any float dtype; converted to float32), row ``i``
            belongs to ``states[i]``. Modified in place when penalties apply.
        states: Per-row sampler state (params, RNG, penalty counts).
        default_gen: RNG for rows without a seed (``None`` = torch's global RNG).
        argmax: Row-wise argmax for an all-greedy step without penalties, ``[R, V] -> [R]`` int64, with torch's
            semantics (first index on ties); the engine passes the native kernel's
            (:meth:`~inference.engine.kernels.Elementwise.argmax`). ``None``: torch's.
        sampler: The native sampler for the sampled rows (:data:`NativeSampler`; the engine passes
            :meth:`~inference.engine.kernels.TopPSampler.sample`); ``None``: torch's ops.

    Returns:
        ``R`` token ids. Temperature-0 rows get ``argmax`` (first index on ties, like
        ``transformers`` greedy search); others are sampled with temperature, top-k and top-p.
    """
    greedy = [s.params.greedy for s in states]
    penalties = any(s.params.has_penalties for s in states)
    if logits.device.type != "cpu" and not (all(greedy) and not penalties):
        logits = logits.float().cpu()  # per-request generators and penalty state live on CPU
    if all(greedy) and not penalties and argmax is not None and logits.device.type == "cpu":
        return argmax(logits.contiguous()).tolist()
    if all(greedy) and not penalties:
        # The float32 cast is exact and monotonic, so argmax picks the same (first) index; it is
        # done because torch's bfloat16 argmax kernel is ~4x slower than cast + float32 argmax.
        return logits.float().argmax(dim=-1).tolist()
    if logits.dtype != torch.float32:
        logits = logits.float()
    elif logits.is_inference():
        # float32 models: the runner's output is an inference-mode tensor, which the in-place penalty
        # updates below may not modify outside inference mode (bf16 gets a fresh copy from .float()).
        logits = logits.clone()
    if penalties:
        logits = logits.contiguous()  # the penalties write through a flat view (no copy when already so)
        apply_penalties(logits, states)
    if all(greedy):
        return logits.argmax(dim=-1).tolist()
    if not any(greedy):
        return _sample_rows(logits, states, default_gen, sampler).tolist()
    tokens = logits.argmax(dim=-1)
    sampled = [i for i, g in enumerate(greedy) if not g]
    sel = torch.tensor(sampled)
    tokens[sel] = _sample_rows(logits[sel], [states[i] for i in sampled], default_gen, sampler)
    return tokens.tolist()
