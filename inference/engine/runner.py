"""Batched Llama forward pass over a flattened token batch, writing K/V in place.

Why not call the ``transformers`` model: for a 135M model on CPU its per-layer Python
overhead, ``DynamicCache`` concatenations and mask construction cost more than the matmuls.
This module reuses the HF model's weight tensors (no copy: the HF ``q/k/v`` and ``gate/up``
parameters are re-pointed at views of our fused matrices, :mod:`.runner_weights`) and runs the same math:

* all tokens of a step (one per decoding request + prefill chunks) are one ``[T, hidden]``
  matrix for embeddings, RMSNorm, QKV, O, MLP; ``lm_head`` runs only for rows that need a next
  token (the "selective logits" of vLLM / Orca's iteration-level batching);
* Q/K/V and gate/up are fused into one projection each (:mod:`.runner_linear`); every operation (projections,
  gate/up with its SiLU, attention, norms, RoPE with the K/V cache writes, the greedy argmax) runs the implementation
  the kernel registry (:mod:`.kernels.registry`) chose once at load time for this CPU, dtype and batch shape: native
  kernels (:mod:`.kernels`), oneDNN with the weights packed once, or plain torch;
* RMSNorm in float32 then cast back (``LlamaRMSNorm``), RoPE with HF's ``rotate_half``
  convention and cos/sin tables computed exactly like ``LlamaRotaryEmbedding``;
* decode and prefill attention over the slot KV cache (:mod:`.runner_attention`);
* oneDNN matmuls of more than ``ROW_BUCKET`` rows are padded to a multiple of it (bounded primitive cache).

In float32 the greedy tokens match ``model.generate(do_sample=False)`` token for token (tests
check it); remaining differences are float rounding from different matmul shapes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from . import block_quant, memory
from .errors import EngineError
from .kernels import registry
from .kernels.registry import KernelMemory
from .kv_cache import KVCache
from .runner_attention import AttentionMixin
from .runner_linear import ROW_BUCKET, GatedUp, Linear, Natives, bucket_rows, uses_onednn
from .runner_pointwise import PointwiseMixin
from .runner_weights import BlockLookup, bias_of, fuse, own_small_tensors, release

logger = logging.getLogger(__name__)

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


@dataclass
class _Layer:
    ln1: torch.Tensor
    qkv: Linear
    o: Linear
    ln2: torch.Tensor
    #: gate/up with the SiLU-and-multiply: ``[T, hidden] -> [T, intermediate]``.
    gate_up: GatedUp
    down: Linear


class ModelRunner(AttentionMixin, PointwiseMixin):
    """Executes :class:`StepBatch` es against a :class:`KVCache` using a Llama-family model.

    Args:
        model: ``LlamaForCausalLM``-compatible HF model (``model.model.layers[i].self_attn.
            q_proj`` ... ``mlp.down_proj``, ``model.model.norm``, ``lm_head``), in eval mode.
        kv: The KV cache the runner writes into and attends over.
        max_positions: Size of the RoPE tables (the context length).
        native_kernels: Let the registry choose the native CPU kernels where they can be built and are faster
            (:mod:`.kernels.registry`; ``docs/engine-kernels.md`` lists them); ``False`` keeps torch's SDPA, oneDNN and
            element-wise ops everywhere.
        release_weights: Free the float weights the ``transformers`` model holds wherever the runner has
            other forms of them: a projection whose every row count runs from a packed copy or GGUF blocks and
            some from the blocks, and the embedding when it is recovered as blocks too (looked up from them, bit for
            bit the same rows). Done layer by layer while packing, so the float32 model and its packed copy never
            sit in memory whole at once. Afterwards ``model`` can no longer run on its own (its emptied modules raise
            on use). Only for an engine that owns its model.
        block_weights: GGUF blocks by parameter name (``LoadedModel.block_weights``, from the float32 checkpoint of
            a model run in bf16); fused projections stack their parts' blocks. Without them a projection's blocks
            are recovered from its own weight, which only a float32 weight can give.
        kernel_memory: ``"fast"``: the kernels measured fastest on this CPU kind; ``"low"``: the ones that read the
            GGUF blocks wherever a weight has them (:mod:`.kernels.registry`; ``EngineConfig.kernel_memory``).

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
        kernel_memory: KernelMemory = "fast",
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
        self.intermediate = model.model.layers[0].mlp.gate_proj.out_features if model.model.layers else 0
        if release_weights:
            own_small_tensors(model)
        weight = model.model.embed_tokens.weight
        self.dtype = weight.dtype
        self.device = weight.device
        self.embed = weight.data
        self.final_norm = model.model.norm.weight.data
        native = native_kernels and self.device.type == "cpu"
        natives = Natives.load(native=native, memory=kernel_memory)
        self.elementwise = natives.elementwise
        self._choose_pointwise(native, cfg.hidden_size)
        blocks_of = BlockLookup(model, block_weights)
        self.layers: list[_Layer] = [
            self._layer(layer, natives, blocks_of, release_weights) for layer in model.model.layers
        ]
        #: Called before each layer but the first (the engine's thread-count check within long steps); None: none.
        self.between_layers: Callable[[], None] | None = None
        #: Steps of up to this many rows run their projections on the AMX kernel (no padding to ROW_BUCKET); 0: none.
        self.amx_rows = self.layers[0].qkv.rows_upto("linear_amx") if self.layers else 0
        embed_tokens = model.model.embed_tokens
        tied = embed_tokens.weight.data_ptr() == model.lm_head.weight.data_ptr()
        # A tied lm_head is saved under the embedding's name only.
        head_blocks = blocks_of(model.lm_head) or (blocks_of(embed_tokens) if tied else None)
        self.lm_head = Linear(
            model.lm_head.weight.data, bias_of(model.lm_head), block_weight=head_blocks, natives=natives
        )
        #: The embedding as GGUF blocks when its float copy was released (rows dequantized per lookup).
        self.embed_blocks: block_quant.BlockWeight | None = None
        if release_weights and self.lm_head.covered:
            self.embed_blocks = self.lm_head.block_weight if tied else blocks_of(embed_tokens)
            if self.embed_blocks is None and not tied:
                self.embed_blocks = block_quant.recover(self.embed)
            loaded = {id(m): m.weight.data for m in (embed_tokens, model.lm_head)}
            if self.embed_blocks is not None:
                self.embed = None
                release(None, loaded, embed_tokens)
            release(self.lm_head, loaded, model.lm_head)
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

        self._choose_attention(native)
        logger.info("engine kernels (%s, %s): %s", registry.cpu_kind(), self.dtype, self.kernel_choices())

    # ------------------------------------------------------------------ load-time choices
    def _layer(self, layer: Any, natives: Natives, blocks_of: BlockLookup, release_weights: bool) -> _Layer:
        """One decoder layer's projections, fused and bound to the registry's choices; with ``release_weights`` the
        float weights they no longer read are freed before the next layer is packed."""
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
        wqkv, bqkv = fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        wgu, bgu = fuse([mlp.gate_proj, mlp.up_proj])
        lw = _Layer(
            ln1=layer.input_layernorm.weight.data,
            qkv=Linear(
                wqkv, bqkv, block_weight=blocks_of(attn.q_proj, attn.k_proj, attn.v_proj), natives=natives
            ),
            o=Linear(
                attn.o_proj.weight.data,
                bias_of(attn.o_proj),
                block_weight=blocks_of(attn.o_proj),
                natives=natives,
            ),
            ln2=layer.post_attention_layernorm.weight.data,
            gate_up=GatedUp(
                wgu,
                bgu,
                mlp.gate_proj.out_features,
                block_weight=blocks_of(mlp.gate_proj, mlp.up_proj),
                natives=natives,
            ),
            down=Linear(
                mlp.down_proj.weight.data,
                bias_of(mlp.down_proj),
                block_weight=blocks_of(mlp.down_proj),
                natives=natives,
            ),
        )
        del wqkv, wgu  # the projections and the modules' views hold them; release may free them now
        if release_weights:
            release(lw.qkv, loaded, attn.q_proj, attn.k_proj, attn.v_proj)
            release(lw.o, loaded, attn.o_proj)
            release(lw.gate_up, loaded, mlp.gate_proj, mlp.up_proj)
            release(lw.down, loaded, mlp.down_proj)
            # The freed weights lie between live chunks of the heap, where glibc neither reuses them for the
            # next layer's packed copies nor returns them by itself: without this the build climbed ~350 MB
            # over the load (bf16, default model) and fell back only at its end.
            memory.trim_heap()
        return lw

    def kernel_choices(self) -> dict[str, str]:
        """What runs where, for logs and docs: by op, ``"name (rows up to N), name (any)"`` (layer 0 for the
        projections)."""

        def bands(op: Any) -> str:
            return ", ".join(
                f"{k.name} ({'any' if upto is None else f'<= {upto}'})" for upto, k, _ in op.bands
            )

        choices: dict[str, str] = {}
        if self.layers:
            lw = self.layers[0]
            choices = {
                "qkv": bands(lw.qkv),
                "o": bands(lw.o),
                "gate_up": bands(lw.gate_up),
                "down": bands(lw.down),
            }
            if lw.gate_up.linear is not None:
                choices["gate_up (unfused linear)"] = bands(lw.gate_up.linear)
        choices["lm_head"] = bands(self.lm_head)
        choices["decode_attention"] = "decode_attention" if self.decode_kernel is not None else "torch"
        choices["prefill_attention"] = ", ".join(
            f"{name} ({'any' if upto is None else f'<= {upto}'})" for upto, name in self.prefill_bands
        )
        choices["norms"] = "native" if self.elementwise is not None else "torch"
        choices["rope_cache"] = "rope_cache" if self.rope_cache is not None else "torch"
        return choices

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
        ops = [
            (lw.qkv, hidden),
            (lw.o, self.num_heads * self.head_dim),
            (lw.gate_up, hidden),
            (lw.down, self.intermediate),
        ]
        rows = [r for r in range(2 * ROW_BUCKET, max_rows + 1, ROW_BUCKET) if r > self.amx_rows]
        calls = [(op, width, r) for r in rows for op, width in ops if uses_onednn(op, r)]
        if not calls:
            return 0.0
        started = time.perf_counter()
        for op, width, r in calls:
            op(torch.zeros(r, width, dtype=self.dtype, device=self.device))
        return time.perf_counter() - started

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
        # gate/up, down) get bucket-sized inputs without a padded copy each (``runner_linear.bucketed``); the pad rows stay zero (no
        # bias) or at least finite and are never read back. A 1500-token prefill: 120 copies -> 30 (the attention
        # output for o_proj) + 1.
        padded = T if T <= self.amx_rows else bucket_rows(T)
        if padded != T:
            x = F.pad(x, (0, 0, 0, padded - T))
        qk_width = (nh + nkv) * hd
        delta: torch.Tensor | None = None  # the last MLP's output, added to x together with the next norm
        between = self.between_layers
        for li, lw in enumerate(self.layers):
            if between is not None and li:
                between()
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
            delta = lw.down(lw.gate_up(h))

        if delta is not None:
            x.add_(delta)
        x = x[:T]
        rows = batch.logit_rows
        if len(rows) != T or rows != list(range(T)):
            x = x.index_select(0, torch.tensor(rows, dtype=torch.long, device=dev))
        return self.lm_head(self._rms_norm(x, self.final_norm))
