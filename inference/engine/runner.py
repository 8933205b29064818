"""Batched Llama forward pass over a flattened token batch, writing K/V in place.

Why not call the ``transformers`` model: for a 135M model on CPU its per-layer Python
overhead, ``DynamicCache`` concatenations and mask construction cost more than the matmuls.
This module reuses the HF model's weight tensors (no copy: the HF ``q/k/v`` and ``gate/up``
parameters are re-pointed at views of our fused matrices) and runs the same math:

* all tokens of a step (one per decoding request + prefill chunks) are one ``[T, hidden]``
  matrix for embeddings, RMSNorm, QKV, O, MLP; ``lm_head`` runs only for rows that need a next
  token (the "selective logits" of vLLM / Orca's iteration-level batching);
* Q/K/V and gate/up projections are fused into one matmul each, and on CPU every weight is
  pre-packed once for oneDNN (:class:`_Linear`), which is what makes small-batch decode fast; in bf16 on CPUs with
  AVX512-BF16 and no AMX, for the native VNNI kernel instead (faster than oneDNN there at every row count);
* RMSNorm in float32 then cast back (``LlamaRMSNorm``), RoPE with HF's ``rotate_half``
  convention and cos/sin tables computed exactly like ``LlamaRotaryEmbedding``;
* K/V of every token are written into the slot cache (:mod:`.kv_cache`): on CPU in the same pass as RoPE by the
  native ``rope_cache`` kernel, otherwise with ``index_copy_``;
* decode attention: on CPU the native kernel (:mod:`.kernels`, one work item per sequence and KV
  head over exactly its cached positions, 2-7x faster than SDPA here); otherwise one SDPA call for all
  decoding rows over ``cache[:n, :, :max_len]`` with a length mask. GQA without expanding K/V by
  folding the ``n_rep`` query heads of a KV head into the query-length axis;
* prefill chunks attend to the slot's cached prefix + the chunk, causally (chunked prefill, Sarathi / vLLM): on CPU
  all chunks of a step in one call of the native tiled kernel (``prefill_attention``, FlashAttention-2 style, key
  tiles past a query block skipped; on CPUs with AMX its products run on the tiles), except that on AMX CPUs where
  the kernel cannot use them chunks of ``AMX_SDPA_MIN_TOKENS`` or more go to torch's SDPA; otherwise one SDPA per
  chunk with a causal mask offset by the prefix length;
* oneDNN matmuls of more than ``ROW_BUCKET`` rows are padded to a multiple of it (bounded primitive cache).

In float32 the greedy tokens match ``model.generate(do_sample=False)`` token for token (tests
check it); remaining differences are float rounding from different matmul shapes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from . import block_quant, kernels, memory
from .errors import EngineError
from .kv_cache import KVCache
from .loader import cpu_has_amx

_SUPPORTED_ROPE = ("default", "linear", "llama3", "yarn")


@dataclass
class StepBatch:
    """Flattened inputs of one engine step (built by the scheduler).

    Token layout: the first ``num_decode`` tokens are decodes (one per decoding request, in
    ``decode_slots`` order), followed by the prefill chunks in ``prefills`` order.

    Attributes:
        token_ids, positions, slots: ``T`` entries each: input token, its absolute position in
            its sequence and the KV slot of its sequence.
        num_decode: Number of decode tokens at the front.
        decode_slots: Slot of each decode token.
        prefills: ``(slot, start_position, length)`` per prefill chunk.
        logit_rows: Token indices whose next-token logits are needed, in output row order.
    """

    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    num_decode: int = 0
    decode_slots: list[int] = field(default_factory=list)
    prefills: list[tuple[int, int, int]] = field(default_factory=list)
    logit_rows: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


#: oneDNN builds and caches a primitive (with its own buffers) per matmul row count, so a long-lived engine that
#: has served many prompt lengths grew by ~415 MB over 212 lengths (952 -> 1367 MB resident, bf16, 2026-11-24).
#: Steps of more rows than this are padded to a multiple of it: about 50 shapes at most (1-32, then
#: multiples of 32 up to the step budget), +53 MB over the same lengths; no measurable cost (a 512-row prefill step
#: is already a multiple, a 1500-token prompt's last 476-row chunk becomes 480 rows).
ROW_BUCKET = 32

#: On a CPU with AMX tiles where the native kernel cannot use them (head size other than 64), bf16 prefill chunks of
#: at least this many tokens attend through torch's SDPA (GQA, no K/V copy): its flash-attention kernel multiplies on
#: the tiles via oneDNN's brgemm ukernel. Measured on a 2-vCPU
#: Xeon with AMX (2026-11-24), one layer: a 1500-token prompt 4.5 ms against the native kernel's 16.0, a 512-token
#: chunk after 1000 cached tokens 3.5 against 9.0, a 32-token chunk 0.038 against 0.056; below ~32 tokens SDPA's
#: per-call cost wins back (32 chunks of 16 tokens: 1.0 ms against 0.5), so short chunks stay on the kernel.
AMX_SDPA_MIN_TOKENS = 32


def _onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + b`` with ``W`` pre-packed by ``torch.ops.mkldnn._reorder_linear_weight``; ``x`` ``[m, k]``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class _Linear:
    """``y = x @ W.T + b`` with the weight pre-packed for oneDNN when possible, or for the native VNNI kernel.

    ``F.linear`` on CPU re-lays-out (reorders) the weight for oneDNN on every call; for the
    small-M matmuls of decoding this costs 30-45% extra (measured on AVX-512-BF16: gate/up
    [32x576]x[576x3072] 0.93 -> 0.66 ms, lm_head 16 -> 10.7 ms). Packing once at load time with
    ``torch.ops.mkldnn._reorder_linear_weight`` (what TorchInductor's CPU freezing pass does)
    removes that. The packed path is verified against ``F.linear`` at construction and silently
    falls back if the private op is missing or disagrees.

    With ``tiled`` (:meth:`ModelRunner._tiled_kernel`: bf16 on a CPU with AVX512-BF16 and no AMX, float32 on AVX2/FMA)
    the weight is packed for that native register-tile kernel instead, which then runs every row count the few-rows
    kernels do not take, in place of oneDNN (2-vCPU Zen 5, bf16: a 32-row decode step's projections 16.2 -> ~11 ms).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        pack: bool,
        rows: kernels.LinearRows | None = None,
        blocks: kernels.LinearBlocks | None = None,
        block_weight: block_quant.BlockWeight | None = None,
        tiled: kernels.LinearVnni | kernels.LinearFma | None = None,
        gated: bool = False,
        amx: kernels.LinearAmx | None = None,
    ) -> None:
        self.weight = weight
        self.bias = bias
        #: Rows past the few-rows kernels go to a gated form of this weight (:class:`_GatedUp`,
        #: :class:`_TiledGatedUp`), so no packed copy is made.
        self.gated = gated
        self.packed: torch.Tensor | None = None
        self.tiled = tiled if tiled is not None and tiled.supports(weight) and not gated else None
        # A decode step of one sequence: the native kernel streams the weights at memory bandwidth.
        self.rows = rows if rows is not None and rows.supports(weight) else None
        # Weights that are exactly GGUF block-quantized values: the few-rows kernel reads the blocks instead. A bf16
        # weight is rounded, so its blocks come from the loader (``block_weight``, the float32 checkpoint's).
        if blocks is not None and block_weight is None:
            block_weight = block_quant.recover(weight)
        fits = block_weight is not None and block_weight.d.shape[0] == weight.shape[0]
        fits = fits and block_weight.d.shape[1] * block_quant.QK == weight.shape[1]
        self.block_weight = block_weight if blocks is not None and fits else None
        self.blocks = blocks if self.block_weight is not None else None
        #: float32 with Q8_0 or Q4_1 blocks (the default model's tied lm_head and layers): the tile kernel reads them,
        #: each column block dequantized in cache, instead of float panels 4-6 times their size (the same sums bit for
        #: bit; 538 -> 98 MB for the default model, level in speed at 32 rows).
        self.tiled_blocks: kernels.TiledBlocks | None = None
        if isinstance(self.tiled, kernels.LinearFma) and self.tiled.supports_blocks(self.block_weight):
            self.tiled_blocks = self.tiled.pack_blocks(self.block_weight)
        self.tiled_weight = (
            self.tiled.pack(weight) if self.tiled is not None and self.tiled_blocks is None else None
        )
        if pack and self.tiled is None and not gated:
            self.packed = _try_pack(weight, bias)
        # float32 weights: the blocks up to the kernel's row limit (oneDNN reads 4 bytes a weight). bf16: one row
        # only; from two rows oneDNN's bf16 kernel is as fast (2-vCPU Xeon: 18.2 ms a step against 18.0 at 2 rows).
        self.block_rows = self.blocks.USE_UP_TO_ROWS if self.blocks and weight.dtype == torch.float32 else 1
        # bf16 on a CPU with AMX: from two rows up to the AMX kernel's limit the blocks are dequantized in cache and
        # multiplied on the tiles (a 32-row decode step's projections: 12.2 ms against oneDNN's 18.9).
        usable = amx is not None and self.block_weight is not None and weight.dtype == torch.bfloat16
        self.amx = amx if usable and amx.supports(self.block_weight) else None

    @property
    def covered(self) -> bool:
        """``True`` when every row count runs without the float weight: the GGUF blocks up to
        ``LinearBlocks.USE_UP_TO_ROWS`` rows, the tile-packed or oneDNN-packed copy (or the gated form) beyond."""
        large = (
            self.packed is not None
            or self.tiled_weight is not None
            or self.tiled_blocks is not None
            or self.gated
        )
        return large and self.blocks is not None

    def small(self, rows: int) -> bool:
        """Whether a call of ``rows`` rows runs in the native few-rows kernels (GGUF blocks or float rows)."""
        if self.blocks is not None and 0 < rows <= self.block_rows:
            return True
        return self.rows is not None and 0 < rows <= self.rows.USE_UP_TO_ROWS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocks is not None and 0 < x.shape[0] <= self.block_rows:
            return self.blocks(x.contiguous(), self.block_weight, self.bias)
        if self.rows is not None and 0 < x.shape[0] <= self.rows.USE_UP_TO_ROWS:
            return self.rows(x.contiguous(), self.weight, self.bias)
        if self.amx is not None and x.shape[0] <= self.amx.USE_UP_TO_ROWS:
            return self.amx(x.contiguous(), self.block_weight, self.bias)
        if self.tiled_blocks is not None:
            return self.tiled.call_blocks(x.contiguous(), self.tiled_blocks, self.bias)
        if self.tiled_weight is not None:
            return self.tiled(x.contiguous(), self.tiled_weight, self.bias)
        if self.packed is not None:
            return _bucketed(x, lambda rows: _onednn_linear(rows, self.packed, self.bias))
        return F.linear(x, self.weight, self.bias)


def _bucket_rows(m: int) -> int:
    """``m`` rounded up to a multiple of ``ROW_BUCKET`` when over it (the row count :func:`_bucketed` runs), else ``m``."""
    return m if m <= ROW_BUCKET or m % ROW_BUCKET == 0 else m + ROW_BUCKET - m % ROW_BUCKET


def _bucketed(x: torch.Tensor, matmul: Any) -> torch.Tensor:
    """``matmul(x)`` with ``x`` ``[m, k]`` padded with zero rows to a multiple of ``ROW_BUCKET`` when ``m`` is over it
    (each output row depends on its own input row only, so the padding's rows are dropped)."""
    m = x.shape[0]
    if _bucket_rows(m) == m:
        return matmul(x.contiguous())
    return matmul(F.pad(x, (0, 0, 0, _bucket_rows(m) - m)))[:m]


class _GatedUp:
    """``silu(x @ Wg.T) * (x @ Wu.T)``, LlamaMLP's gate and up projections with the activation, ``[m, k] -> [m, I]``,
    as two oneDNN matmuls: the gate's with SiLU as its post-op (``swish``), the up projection's with the product as
    a binary post-op (``mul``), the epilogue fusion TorchInductor's CPU backend does with the same ops.

    The fused gate/up matmul writes ``[m, 2I]`` and ``silu_mul`` reads it back: at 2048 rows 12.6 MB out and in per
    layer, memory-bound; here nothing but the ``[m, I]`` activation is written in between (2-vCPU Xeon, one layer
    of the default model: 2048 rows 3.9 -> 3.0 ms, 32 rows 0.153 -> 0.124 ms). For bf16 only: the SiLU and the
    product are taken on the float32 accumulators, without the bf16 roundings in between that torch's ops make (the
    outputs differ by bf16 rounding; the float32 engine keeps torch's order bit for bit). Build with :meth:`build`.
    """

    def __init__(self, gate: torch.Tensor, up: torch.Tensor) -> None:
        self.gate, self.up = gate, up

    @classmethod
    def build(cls, weight: torch.Tensor, inter: int) -> _GatedUp | None:
        """From the fused ``[2I, k]`` gate/up weight (bf16); ``None`` when the ops are missing or disagree with
        ``F.silu(x @ Wg.T) * (x @ Wu.T)`` on a probe."""
        try:
            gated = cls(
                torch.ops.mkldnn._reorder_linear_weight(weight[:inter].contiguous(), None),
                torch.ops.mkldnn._reorder_linear_weight(weight[inter:].contiguous(), None),
            )
            probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(
                weight.dtype
            )
            got = gated(probe).float()
        except (RuntimeError, AttributeError, NotImplementedError):
            return None
        gu = F.linear(probe.float(), weight.float())
        want = F.silu(gu[:, :inter]) * gu[:, inter:]
        if not torch.allclose(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max().clamp(min=1.0))):
            return None
        return gated

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        def matmuls(rows: torch.Tensor) -> torch.Tensor:
            act = torch.ops.mkldnn._linear_pointwise(rows, self.gate, None, "swish", [], "")
            return torch.ops.mkldnn._linear_pointwise.binary(rows, act, self.up, None, "mul")

        return _bucketed(x, matmuls)


class _TiledGatedUp:
    """``silu(x @ Wg.T) * (x @ Wu.T)``, ``[m, k] -> [m, I]``, in one pass of a native register-tile kernel
    (:class:`~inference.engine.kernels.LinearVnni` in bf16, :class:`~inference.engine.kernels.LinearFma` in float32):
    gate and up panels packed side by side, the activation taken on the float32 sums (as :class:`_GatedUp` does with
    oneDNN's post-ops). 2-vCPU Zen 5, bf16, one layer of the default model: 32 rows 0.23 ms with oneDNN's gated form,
    0.17 as a VNNI matmul and ``silu_mul``, 0.14-0.16 fused; 512 rows 2.5-2.6, 2.6-3.3 and 2.0-2.4.
    """

    def __init__(
        self,
        tiled: kernels.LinearVnni | kernels.LinearFma,
        weight: torch.Tensor,
        blocks: block_quant.BlockWeight | None = None,
    ) -> None:
        self.tiled = tiled
        #: float32 with Q4_1 blocks of the fused weight: read in that form (:meth:`kernels.LinearFma.pack_blocks`).
        self.blocks: kernels.TiledBlocks | None = None
        self.packed: torch.Tensor | None = None
        if isinstance(tiled, kernels.LinearFma) and tiled.supports_blocks(blocks, swiglu=True):
            self.blocks = tiled.pack_blocks(blocks, swiglu=True)
        else:
            self.packed = tiled.pack(weight, swiglu=True)

    @classmethod
    def build(
        cls,
        tiled: kernels.LinearVnni | kernels.LinearFma,
        weight: torch.Tensor,
        inter: int,
        blocks: block_quant.BlockWeight | None = None,
    ) -> _TiledGatedUp | None:
        """From the fused ``[2I, k]`` gate/up weight (and its GGUF blocks, ``[gate; up]``, where it has them);
        ``None`` when the kernel does not take its shape."""
        if weight.shape[0] != 2 * inter or not tiled.supports(weight, swiglu=True):
            return None
        return cls(tiled, weight, blocks)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocks is not None:
            return self.tiled.call_blocks(x.contiguous(), self.blocks, None)
        return self.tiled(x.contiguous(), self.packed, None, swiglu=True)


class _AmxGatedUp:
    """``silu(x @ Wg.T) * (x @ Wu.T)``, ``[m, k] -> [m, I]``, on AMX tiles from the fused gate/up weight's GGUF blocks
    (:class:`~inference.engine.kernels.LinearAmx` with ``swiglu``) for up to ``LinearAmx.USE_UP_TO_ROWS`` rows, and
    by ``beyond`` (the oneDNN gated form, :class:`_GatedUp`) past that. Build with :meth:`build`."""

    def __init__(self, amx: kernels.LinearAmx, blocks: block_quant.BlockWeight, beyond: _GatedUp) -> None:
        self.amx, self.blocks, self.beyond = amx, blocks, beyond

    @classmethod
    def build(cls, linear: _Linear, beyond: _GatedUp | _TiledGatedUp | None) -> _AmxGatedUp | None:
        """From the gate/up ``_Linear`` when it runs on the AMX kernel and ``beyond`` is oneDNN's gated form, else
        ``None``."""
        if linear.amx is None or not isinstance(beyond, _GatedUp) or linear.bias is not None:
            return None
        if not linear.amx.supports(linear.block_weight, swiglu=True):
            return None
        return cls(linear.amx, linear.block_weight, beyond)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= self.amx.USE_UP_TO_ROWS:
            return self.amx(x.contiguous(), self.blocks, None, swiglu=True)
        return self.beyond(x)


def _try_pack(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        got = _onednn_linear(probe, packed, bias).float()
        want = F.linear(probe, weight, bias).float()
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    tol = 1e-2 if weight.dtype != torch.float32 else 1e-4
    if not torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max().clamp(min=1.0))):
        return None
    return packed


@dataclass
class _Layer:
    ln1: torch.Tensor
    qkv: _Linear
    o: _Linear
    ln2: torch.Tensor
    gate_up: _Linear
    down: _Linear
    #: gate/up and the activation for every step the few-rows kernels do not take (oneDNN's post-ops in bf16, or a
    #: native register-tile kernel's epilogue); ``None``: gate_up, then ``silu_mul``.
    gated: _GatedUp | _TiledGatedUp | _AmxGatedUp | None = None


def _release(linear: _Linear | None, loaded: dict[int, torch.Tensor], *modules: Any) -> None:
    """Drop the float weight of ``linear`` (only when it has packed and block forms; ``None``: no runner copy) and
    of the ``transformers`` modules holding it, so its memory is freed; a module's weight becomes empty.

    ``loaded`` maps ``id(module)`` to the weight it was loaded with (before Q/K/V and gate/up were fused): where
    that is a view of the memory-mapped checkpoint, its pages are evicted now rather than when the last view goes
    (:func:`~inference.engine.memory.drop_file_pages`), which keeps the load's peak near the packed model's size.
    """
    if linear is not None:
        if not linear.covered:
            return
        linear.weight = None  # every call now takes the blocks or the packed copy
        linear.rows = None
    for module in modules:
        module.weight.data = module.weight.data.new_empty(0)
        original = loaded.pop(id(module), None)
        if original is not None:
            memory.drop_file_pages(original)


def _own_small_tensors(model: Any) -> None:
    """Copy the model's vectors (norm weights, biases) into memory of their own.

    ``transformers`` loads a safetensors checkpoint as views of one ``mmap`` of the file; while any tensor still
    points into it, every page of the file that was read (all of it, once the weights are packed) stays in the
    process's resident set. With the matrices released, the vectors are the last such views.
    """
    for param in model.parameters():
        if param.dim() < 2:
            param.data = param.data.clone()


def _bias(linear: Any) -> torch.Tensor | None:
    return linear.bias.data if getattr(linear, "bias", None) is not None else None


def _fuse(modules: list[Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) of several Linear modules along the output dim
    and point the modules at views of the fused tensor so memory is not doubled."""
    weight = torch.cat([m.weight.data for m in modules], dim=0).contiguous()
    has_bias = all(m.bias is not None for m in modules)
    bias = torch.cat([m.bias.data for m in modules], dim=0).contiguous() if has_bias else None
    offset = 0
    for m in modules:
        n = m.weight.shape[0]
        m.weight.data = weight[offset : offset + n]
        if has_bias:
            m.bias.data = bias[offset : offset + n]
        offset += n
    return weight, bias


class ModelRunner:
    """Executes :class:`StepBatch` es against a :class:`KVCache` using a Llama-family model.

    Args:
        model: ``LlamaForCausalLM``-compatible HF model (``model.model.layers[i].self_attn.
            q_proj`` ... ``mlp.down_proj``, ``model.model.norm``, ``lm_head``), in eval mode.
        kv: The KV cache the runner writes into and attends over.
        max_positions: Size of the RoPE tables (the context length).
        native_kernels: Use the native CPU kernels when they can be built (:mod:`.kernels`: decode and prefill
            attention, RoPE with the K/V cache writes, the projections of small decode steps (GGUF blocks up to 8
            rows in float32 and for one row in bf16, float weights for one row), RMSNorm and SiLU-and-multiply,
            the greedy argmax, and in bf16 on CPUs with AVX512-BF16 but no AMX every other projection (the VNNI
            kernel, with the MLP's activation fused into gate/up) in place of oneDNN); ``False`` keeps torch's
            SDPA, oneDNN and element-wise ops everywhere. On a CPU with AMX, bf16 prefill chunks of
            ``AMX_SDPA_MIN_TOKENS`` or more still attend through SDPA.
        release_weights: Free the float weights the ``transformers`` model holds wherever the runner has
            other forms of them: a projection with both a packed copy (oneDNN's or the VNNI kernel's) and GGUF
            blocks, and the embedding when it is recovered as blocks too (looked up from them, bit for bit the
            same rows).
            Done layer by layer while packing, so the float32 model and its packed copy never sit in memory
            whole at once. Afterwards ``model`` can no longer run on its own (its emptied modules raise
            on use). Only for an engine that owns its model.
        block_weights: GGUF blocks by parameter name (``LoadedModel.block_weights``, from the float32 checkpoint of
            a model run in bf16); fused projections stack their parts' blocks. Without them a projection's blocks
            are recovered from its own weight, which only a float32 weight can give.

    Raises:
        EngineError: unsupported architecture features (activation other than SiLU, dynamic
            RoPE variants).
    """

    def __init__(
        self,
        model: Any,
        kv: KVCache,
        max_positions: int,
        native_kernels: bool = True,
        release_weights: bool = False,
        block_weights: dict[str, block_quant.BlockWeight] | None = None,
    ) -> None:
        cfg = model.config
        if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish"):
            raise EngineError(f"unsupported hidden_act {cfg.hidden_act!r}")
        rotary = model.model.rotary_emb
        rope_type = getattr(rotary, "rope_type", "default")
        if rope_type not in _SUPPORTED_ROPE:
            raise EngineError(f"unsupported rope_type {rope_type!r}")
        self.kv = kv
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.n_rep = self.num_heads // self.num_kv_heads
        self.scale = self.head_dim**-0.5
        self.eps = float(cfg.rms_norm_eps)
        self.vocab_size = model.lm_head.weight.shape[0]
        if release_weights:
            _own_small_tensors(model)
        weight = model.model.embed_tokens.weight
        self.dtype = weight.dtype
        self.device = weight.device
        self.embed = weight.data
        self.final_norm = model.model.norm.weight.data
        pack = (
            self.device.type == "cpu"
            and self.dtype in (torch.bfloat16, torch.float32)
            and torch.backends.mkldnn.is_available()
        )
        native = native_kernels and self.device.type == "cpu"
        rows = kernels.linear_rows() if native else None
        blocks = kernels.linear_blocks() if native else None
        tiled = self._tiled_kernel(native)
        amx = kernels.linear_amx() if native and self.dtype == torch.bfloat16 else None
        self.elementwise = kernels.elementwise() if native else None
        #: The greedy argmax of the logits (``[R, V] -> [R]``) when the native kernel is there, else ``None``.
        self.argmax = self.elementwise.argmax if self.elementwise is not None else None
        self.rope_cache = kernels.rope_cache() if native else None
        names = {id(module): name for name, module in model.named_modules()}
        given = block_weights or {}

        def exact(*modules: Any) -> block_quant.BlockWeight | None:
            # The loader's blocks of these modules' weights stacked (fused projections), or None.
            parts = [given.get(f"{names.get(id(m))}.weight") for m in modules]
            if any(p is None for p in parts):
                return None
            try:
                return block_quant.concat(parts)
            except ValueError:  # parts of different kinds
                return None

        self.layers: list[_Layer] = []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projections = (
                attn.q_proj,
                attn.k_proj,
                attn.v_proj,
                attn.o_proj,
                mlp.gate_proj,
                mlp.up_proj,
                mlp.down_proj,
            )
            # The weights as loaded (views of the checkpoint's mapping), taken before fusing re-points the modules.
            loaded = {id(m): m.weight.data for m in projections} if release_weights else {}
            wqkv, bqkv = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
            wgu, bgu = _fuse([mlp.gate_proj, mlp.up_proj])
            inter = mlp.gate_proj.out_features
            # The gate/up blocks, the loader's or recovered here as _Linear would (they also feed the gated form's
            # Q4_1 panels in float32).
            gu_blocks = exact(mlp.gate_proj, mlp.up_proj)
            if gu_blocks is None and blocks is not None:
                gu_blocks = block_quant.recover(wgu)
            gated: _GatedUp | _TiledGatedUp | None = None
            if tiled is not None and bgu is None:
                gated = _TiledGatedUp.build(tiled, wgu, inter, gu_blocks)
            elif pack and native and self.dtype == torch.bfloat16 and bgu is None:
                gated = _GatedUp.build(wgu, inter)
            lw = _Layer(
                ln1=layer.input_layernorm.weight.data,
                qkv=_Linear(
                    wqkv,
                    bqkv,
                    pack,
                    rows,
                    blocks,
                    exact(attn.q_proj, attn.k_proj, attn.v_proj),
                    tiled,
                    amx=amx,
                ),
                o=_Linear(
                    attn.o_proj.weight.data,
                    _bias(attn.o_proj),
                    pack,
                    rows,
                    blocks,
                    exact(attn.o_proj),
                    tiled,
                    amx=amx,
                ),
                ln2=layer.post_attention_layernorm.weight.data,
                gate_up=_Linear(
                    wgu,
                    bgu,
                    pack,
                    rows,
                    blocks,
                    gu_blocks,
                    tiled,
                    gated is not None,
                    amx,
                ),
                down=_Linear(
                    mlp.down_proj.weight.data,
                    _bias(mlp.down_proj),
                    pack,
                    rows,
                    blocks,
                    exact(mlp.down_proj),
                    tiled,
                    amx=amx,
                ),
                gated=gated,
            )
            lw.gated = _AmxGatedUp.build(lw.gate_up, gated) or gated
            del wqkv, wgu  # the _Linear and the modules' views hold them; _release may free them now
            if release_weights:
                _release(lw.qkv, loaded, attn.q_proj, attn.k_proj, attn.v_proj)
                _release(lw.o, loaded, attn.o_proj)
                _release(lw.gate_up, loaded, mlp.gate_proj, mlp.up_proj)
                _release(lw.down, loaded, mlp.down_proj)
                # The freed weights lie between live chunks of the heap, where glibc neither reuses them for the
                # next layer's packed copies nor returns them by itself: without this the build climbed ~350 MB
                # over the load (bf16, default model) and fell back only at its end.
                memory.trim_heap()
            self.layers.append(lw)
        self.intermediate = model.model.layers[0].mlp.gate_proj.out_features
        #: Steps of up to this many rows run their projections on the AMX kernel (no padding to ROW_BUCKET); 0: none.
        self.amx_rows = (
            amx.USE_UP_TO_ROWS if amx is not None and self.layers and self.layers[0].qkv.amx else 0
        )
        embed_tokens = model.model.embed_tokens
        tied = embed_tokens.weight.data_ptr() == model.lm_head.weight.data_ptr()
        # A tied lm_head is saved under the embedding's name only.
        head_blocks = exact(model.lm_head) or (exact(embed_tokens) if tied else None)
        self.lm_head = _Linear(
            model.lm_head.weight.data, _bias(model.lm_head), pack, rows, blocks, head_blocks, tiled, amx=amx
        )
        #: The embedding as GGUF blocks when its float copy was released (rows dequantized per lookup).
        self.embed_blocks: block_quant.BlockWeight | None = None
        if release_weights and self.lm_head.covered:
            self.embed_blocks = self.lm_head.block_weight if tied else exact(embed_tokens)
            if self.embed_blocks is None and not tied:
                self.embed_blocks = block_quant.recover(self.embed)
            loaded = {id(m): m.weight.data for m in (embed_tokens, model.lm_head)}
            if self.embed_blocks is not None:
                self.embed = None
                _release(None, loaded, embed_tokens)
            _release(self.lm_head, loaded, model.lm_head)
        kernel = kernels.decode_attention() if native else None
        supported = kernel is not None and kernel.supports(
            self.dtype, head_dim=self.head_dim, n_rep=self.n_rep
        )
        self.decode_kernel = kernel if supported else None
        prefill = kernels.prefill_attention() if native else None
        supported = prefill is not None and prefill.supports(
            self.dtype, head_dim=self.head_dim, n_rep=self.n_rep
        )
        self.prefill_kernel = prefill if supported else None
        #: Prefill chunks of this many tokens or more use SDPA instead of the native kernel (AMX CPUs, bf16, when the
        #: kernel cannot use the tiles itself: its AVX-512 dot products lose to torch's AMX flash attention there).
        self.sdpa_prefill_from: int | None = None
        amx_cpu = self.dtype == torch.bfloat16 and cpu_has_amx()
        if self.prefill_kernel is not None and amx_cpu and not self.prefill_kernel.uses_amx(self.head_dim):
            self.sdpa_prefill_from = AMX_SDPA_MIN_TOKENS
        # Same formula and order of float ops as LlamaRotaryEmbedding.forward, evaluated once.
        inv_freq = rotary.inv_freq.to(device=self.device, dtype=torch.float32)
        t = torch.arange(max_positions, device=self.device, dtype=torch.float32)
        freqs = t[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        scaling = getattr(rotary, "attention_scaling", 1.0)
        self.cos = (emb.cos() * scaling).to(self.dtype)
        sin = (emb.sin() * scaling).to(self.dtype)
        half = sin.shape[-1] // 2
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        self._norm_shape = (cfg.hidden_size,)
        self._arange = torch.arange(max(max_positions, kv.slot_len) + 1, device=self.device)
        self._neg_inf = torch.tensor(float("-inf"), dtype=self.dtype, device=self.device)
        self._zero = torch.tensor(0.0, dtype=self.dtype, device=self.device)

    # ------------------------------------------------------------------ helpers
    def _tiled_kernel(self, native: bool) -> kernels.LinearVnni | kernels.LinearFma | None:
        """The native register-tile linear kernel for this dtype where it was measured faster than oneDNN, else ``None``.

        bf16: :class:`~inference.engine.kernels.LinearVnni` on CPUs with AVX512-BF16 and no AMX tiles (with AMX,
        oneDNN's bf16 matmuls run on the tiles; not measured against it). float32:
        :class:`~inference.engine.kernels.LinearFma` on CPUs with AVX2 and FMA, in 512-bit registers where the CPU has
        AVX-512 (README, Performance, rounds 11 and 14): it reads the GGUF blocks of the weights that have them, so the
        float32 engine holds ~5 bits a weight instead of oneDNN's packed 32.
        """
        if not native:
            return None
        if self.dtype == torch.bfloat16 and not cpu_has_amx():
            return kernels.linear_vnni()
        if self.dtype == torch.float32:
            return kernels.linear_fma()
        return None

    @torch.inference_mode()
    def warm_up(self, max_rows: int) -> float:
        """Run each projection shape once at every row count over ``ROW_BUCKET`` that a step of up to ``max_rows``
        tokens can give oneDNN (its multiples of ``ROW_BUCKET``), so its matmul primitives exist before the first
        request needs them; returns the seconds it took (0 when no projection runs on oneDNN).

        oneDNN builds a primitive per input shape on first use: 2-5 ms each for the default model's shapes on a
        2-vCPU Xeon, which a fresh server's first prompts paid (a 1500-token prompt's prefill step 457 against 401
        ms the second time). Layer 0 stands for all layers: the primitive cache is keyed by shapes, not weights.
        """
        if not self.layers:
            return 0.0
        lw = self.layers[0]
        hidden = self.final_norm.shape[0]
        calls = [(lw.qkv, hidden), (lw.o, self.num_heads * self.head_dim), (lw.down, self.intermediate)]
        calls = [(linear, width) for linear, width in calls if linear.packed is not None]
        gated = lw.gated if isinstance(lw.gated, _GatedUp | _AmxGatedUp) else None
        if lw.gate_up.packed is not None:
            calls.append((lw.gate_up, hidden))
        if not calls and gated is None:
            return 0.0
        started = time.perf_counter()
        for rows in range(2 * ROW_BUCKET, max_rows + 1, ROW_BUCKET):
            if rows <= self.amx_rows:
                continue
            for linear, width in calls:
                linear(torch.zeros(rows, width, dtype=self.dtype, device=self.device))
            if gated is not None:
                gated(torch.zeros(rows, hidden, dtype=self.dtype, device=self.device))
        return time.perf_counter() - started

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in float32, cast back, then the weight
        # multiply in the model dtype. F.rms_norm without weight is the same float32 math in one
        # kernel (bit-identical; checked by test_runner_matches_hf_modules). The native kernel does the
        # same math in one pass, summing the squares in another order.
        if self.elementwise is not None:
            return self.elementwise.rms_norm(x, weight, self.eps)
        h = F.rms_norm(x.float(), self._norm_shape, eps=self.eps)
        return weight * h.to(x.dtype)

    def _add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor
    ) -> torch.Tensor:
        """``x[:len(delta)] += delta`` in place (the residual add; ``None``: nothing to add), then ``_rms_norm(x)``:
        one native pass when the kernels are there."""
        if delta is None:
            return self._rms_norm(x, weight)
        if self.elementwise is not None:
            return self.elementwise.add_rms_norm(x, delta, weight, self.eps)
        x[: delta.shape[0]].add_(delta)
        return self._rms_norm(x, weight)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        # HF: x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1). Here the halves
        # are swapped with one flip and the minus sign lives in sin_signed = cat(-sin1, sin2);
        # (-a) * b == a * (-b) exactly, so the result is bit-identical.
        half = x.shape[-1] // 2
        swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)
        return (x * cos) + (swapped * sin_signed)

    def _mask(self, keep: torch.Tensor) -> torch.Tensor:
        return torch.where(keep, self._zero, self._neg_inf)

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        """Run one step.

        Returns:
            ``[len(batch.logit_rows), vocab]`` logits in the model dtype, row ``i`` predicting
            the token after ``batch.token_ids[batch.logit_rows[i]]``.
        """
        dev = self.device
        T = batch.num_tokens
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        kv = self.kv
        L = kv.slot_len

        ids = torch.tensor(batch.token_ids, dtype=torch.long, device=dev)
        pos = torch.tensor(batch.positions, dtype=torch.long, device=dev)
        slots = torch.tensor(batch.slots, dtype=torch.long, device=dev)
        if self.rope_cache is None:
            cos = self.cos.index_select(0, pos).unsqueeze(1)  # [T, 1, hd]
            sin = self.sin_signed.index_select(0, pos).unsqueeze(1)
            # Flat row index of (slot, kv_head, position) in a cache tensor viewed as [-1, hd].
            heads = self._arange[:nkv]
            write_idx = ((slots.unsqueeze(1) * nkv + heads.unsqueeze(0)) * L + pos.unsqueeze(1)).flatten()

        nd = batch.num_decode
        dec = self._decode_plan(batch) if nd else None
        pre = self._prefill_plan(batch)

        if self.embed_blocks is None:
            x = F.embedding(ids, self.embed)
        else:
            # In bf16 the rows round to the bf16 weight's values.
            x = block_quant.dequantize(self.embed_blocks, ids).to(self.dtype)
        # The hidden state carries zero rows up to the next ROW_BUCKET multiple, so the projections fed from it (QKV,
        # gate/up, down) get bucket-sized inputs without a padded copy each (_bucketed); the pad rows stay zero (no
        # bias) or at least finite and are never read back. A 1500-token prefill: 120 copies -> 30 (the attention
        # output for o_proj) + 1.
        padded = T if T <= self.amx_rows else _bucket_rows(T)
        if padded != T:
            x = F.pad(x, (0, 0, 0, padded - T))
        qk_width = (nh + nkv) * hd
        delta: torch.Tensor | None = None  # the last MLP's output, added to x together with the next norm
        for li, lw in enumerate(self.layers):
            h = self._add_rms_norm(x, delta, lw.ln1)
            qkv = lw.qkv(h)[:T]
            k_cache, v_cache = kv.k[li], kv.v[li]
            if self.rope_cache is not None:
                q = self.rope_cache(qkv, self.cos, self.sin_signed, pos, slots, k_cache, v_cache, nh, nkv)
            else:
                qk = self._rope(qkv[:, :qk_width].view(T, nh + nkv, hd), cos, sin)
                q = qk[:, :nh]
                k_cache.view(-1, hd).index_copy_(0, write_idx, qk[:, nh:].reshape(T * nkv, hd))
                v_cache.view(-1, hd).index_copy_(0, write_idx, qkv[:, qk_width:].reshape(T * nkv, hd))

            outs = []
            if dec is not None:
                outs.append(self._decode_attention(q[:nd], k_cache, v_cache, dec))
            for kind, *plan in pre:
                if kind == "kernel":
                    outs.append(
                        self.prefill_kernel(q.contiguous(), k_cache, v_cache, plan[0], self.n_rep, self.scale)
                    )
                elif kind == "gqa":
                    outs.append(self._prefill_attention_gqa(q, k_cache, v_cache, *plan))
                else:
                    (slot, start, n), offset, mask = plan
                    outs.append(
                        self._prefill_attention(
                            q[offset : offset + n], k_cache, v_cache, slot, start, n, mask
                        )
                    )
            attn = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
            h = self._add_rms_norm(x, lw.o(attn), lw.ln2)
            if lw.gated is not None and not lw.gate_up.small(h.shape[0]):
                delta = lw.down(lw.gated(h))
                continue
            gu = lw.gate_up(h)
            if self.elementwise is not None:
                act = self.elementwise.silu_mul(gu)
            else:
                act = F.silu(gu[:, : self.intermediate])
                act.mul_(gu[:, self.intermediate :])
            delta = lw.down(act)

        if delta is not None:
            x.add_(delta)
        x = x[:T]
        rows = batch.logit_rows
        if len(rows) != T or rows != list(range(T)):
            x = x.index_select(0, torch.tensor(rows, dtype=torch.long, device=dev))
        return self.lm_head(self._rms_norm(x, self.final_norm))

    # ------------------------------------------------------------------ attention
    def _decode_plan(self, batch: StepBatch) -> dict[str, Any]:
        """Precompute (once per step, shared by all layers) how decode attention runs."""
        dev = self.device
        nd = batch.num_decode
        dslots = batch.decode_slots
        lens = [p + 1 for p in batch.positions[:nd]]
        if self.decode_kernel is not None:
            return {
                "mode": "kernel",
                "slots": torch.tensor(dslots, dtype=torch.long),
                "lens": torch.tensor(lens, dtype=torch.long),
            }
        hi = max(dslots) + 1
        max_len = max(lens)
        total = sum(lens)
        # Padding every row to the longest sequence wastes work when lengths differ wildly;
        # then one SDPA call per sequence (no padding) is cheaper despite the call overhead.
        if hi * max_len > 2 * total + 256 * nd:
            return {"mode": "loop", "slots": dslots, "lens": lens}
        identity = dslots == list(range(hi))
        slot_lens = [1] * hi  # rows of slots that are not decoding this step: dummy, length 1
        for s, n in zip(dslots, lens, strict=True):
            slot_lens[s] = n
        mask = None
        if min(slot_lens) != max_len:
            lens_t = torch.tensor(slot_lens, dtype=torch.long, device=dev)
            keep = self._arange[:max_len].unsqueeze(0) < lens_t.unsqueeze(1)
            mask = self._mask(keep).view(hi, 1, 1, max_len)
        plan: dict[str, Any] = {"mode": "batched", "hi": hi, "max_len": max_len, "mask": mask}
        if not identity:
            plan["index"] = torch.tensor(dslots, dtype=torch.long, device=dev)
        return plan

    def _decode_attention(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: dict[str, Any]
    ) -> torch.Tensor:
        nd = q.shape[0]
        nkv, n_rep, hd = self.num_kv_heads, self.n_rep, self.head_dim
        # GQA: the n_rep query heads sharing a KV head become the "query length" axis, so K/V
        # are used as stored (no repeat_kv copy). Head h maps to KV head h // n_rep as in HF.
        q4 = q.reshape(nd, nkv, n_rep, hd)
        if plan["mode"] == "kernel":
            out = self.decode_kernel(
                q4.contiguous(), k_cache, v_cache, plan["slots"], plan["lens"], self.scale
            )
            return out.reshape(nd, nkv * n_rep * hd)
        if plan["mode"] == "loop":
            outs = [
                F.scaled_dot_product_attention(
                    q4[i : i + 1], k_cache[s : s + 1, :, :n], v_cache[s : s + 1, :, :n], scale=self.scale
                )
                for i, (s, n) in enumerate(zip(plan["slots"], plan["lens"], strict=True))
            ]
            return torch.cat(outs, dim=0).reshape(nd, nkv * n_rep * hd)
        hi, max_len = plan["hi"], plan["max_len"]
        index = plan.get("index")
        if index is not None:
            full = q4.new_zeros((hi, nkv, n_rep, hd))
            full.index_copy_(0, index, q4)
            q4 = full
        out = F.scaled_dot_product_attention(
            q4, k_cache[:hi, :, :max_len], v_cache[:hi, :, :max_len], attn_mask=plan["mask"], scale=self.scale
        )
        if index is not None:
            out = out.index_select(0, index)
        return out.reshape(nd, nkv * n_rep * hd)

    def _prefill_plan(self, batch: StepBatch) -> list[tuple[Any, ...]]:
        """How the step's prefill chunks attend, shared by all layers, in row order; segments of three kinds:

        * ``("kernel", table)``: consecutive chunks for the native kernel, ``table`` int64 ``[C, 4]`` of (slot,
          start, length, first row);
        * ``("gqa", slots, start, n, first row, mask)``: consecutive chunks of one start and length through one
          SDPA call with grouped KV heads (AMX CPUs, chunks of ``sdpa_prefill_from`` tokens or more), ``slots`` a
          list of their slots; ``mask`` bool ``[n, start + n]``, ``None`` when ``start == 0`` (plain causal);
        * ``("sdpa", (slot, start, n), first row, mask)``: the fallback without native kernels, the query heads of
          a KV head folded into the query axis and an additive causal mask offset by the prefix.
        """
        offset = batch.num_decode
        if self.prefill_kernel is not None:
            segments: list[tuple[Any, ...]] = []
            run: list[tuple[int, int, int, int]] = []
            for slot, start, n in batch.prefills:
                if self.sdpa_prefill_from is not None and n >= self.sdpa_prefill_from:
                    if run:
                        segments.append(("kernel", torch.tensor(run, dtype=torch.long)))
                        run = []
                    last = segments[-1] if segments else None
                    if last is not None and last[0] == "gqa" and last[2:4] == (start, n):
                        last[1].append(slot)  # same shape as the previous chunk: one batched call
                    else:
                        mask = None if start == 0 else torch.ones(n, start + n, dtype=torch.bool).tril(start)
                        segments.append(("gqa", [slot], start, n, offset, mask))
                else:
                    run.append((slot, start, n, offset))
                offset += n
            if run:
                segments.append(("kernel", torch.tensor(run, dtype=torch.long)))
            return segments
        plans: list[tuple[Any, ...]] = []
        for slot, start, n in batch.prefills:
            # Causal mask offset by the cached prefix: query i (position start+i) sees keys
            # 0..start+i. Repeated n_rep times for the folded GQA query layout.
            qpos = self._arange[start : start + n].unsqueeze(1)
            keep = self._arange[: start + n].unsqueeze(0) <= qpos
            mask = self._mask(keep).repeat(self.n_rep, 1)
            plans.append(("sdpa", (slot, start, n), offset, mask))
            offset += n
        return plans

    def _prefill_attention_gqa(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: list[int],
        start: int,
        n: int,
        offset: int,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """``B = len(slots)`` chunks of ``n`` queries each, rows ``offset : offset + B * n`` of ``q`` (``[T, heads,
        hd]``), chunk ``i`` attending to the first ``start + n`` cached positions of ``slots[i]``, in one SDPA call
        with ``enable_gqa`` (head h reads KV head ``h // n_rep``, as HF's ``repeat_kv``); returns ``[B * n, heads *
        hd]``. One chunk reads the cache in place; several are gathered (a copy of their K/V: 16 chunks of 128
        tokens 1.85 -> 1.34 ms a layer against one call each)."""
        end, b = start + n, len(slots)
        if b == 1:
            k, v = k_cache[slots[0] : slots[0] + 1, :, :end], v_cache[slots[0] : slots[0] + 1, :, :end]
        else:
            index = torch.tensor(slots, dtype=torch.long)
            k, v = k_cache[:, :, :end].index_select(0, index), v_cache[:, :, :end].index_select(0, index)
        out = F.scaled_dot_product_attention(
            q[offset : offset + b * n].view(b, n, self.num_heads, self.head_dim).transpose(1, 2),
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.scale,
            enable_gqa=True,
        )
        return out.transpose(1, 2).reshape(b * n, self.num_heads * self.head_dim)

    def _prefill_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot: int,
        start: int,
        n: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        nkv, n_rep, hd = self.num_kv_heads, self.n_rep, self.head_dim
        # [n, nkv*n_rep, hd] -> [1, nkv, n_rep*n, hd]: query rows grouped per KV head.
        qg = q.reshape(n, nkv, n_rep, hd).permute(1, 2, 0, 3).reshape(1, nkv, n_rep * n, hd)
        end = start + n
        out = F.scaled_dot_product_attention(
            qg,
            k_cache[slot : slot + 1, :, :end],
            v_cache[slot : slot + 1, :, :end],
            attn_mask=mask,
            scale=self.scale,
        )
        return out.view(nkv, n_rep, n, hd).permute(2, 0, 1, 3).reshape(n, nkv * n_rep * hd)
