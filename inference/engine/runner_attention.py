"""The runner's attention, as a mixin of :class:`~inference.engine.runner.ModelRunner`: how a step's decode rows and
prefill chunks attend over the slot KV cache, planned once per step and shared by all layers.

* decode: the native kernel (``decode_attention.c``: one work item per sequence and KV head over exactly its cached
  positions, 2-7x faster than SDPA here) when the registry chose it; otherwise one SDPA call for all decoding rows
  over ``cache[:n, :, :max_len]`` with a length mask, or one call per sequence when lengths differ wildly. GQA without
  expanding K/V: the ``n_rep`` query heads of a KV head are folded into the query-length axis;
* prefill (chunked prefill, Sarathi / vLLM): chunks attend to the slot's cached prefix and themselves, causally; all
  chunks of a step in one call of the native tiled kernel (``prefill_attention.c``, FlashAttention-2 style), except
  chunks of ``sdpa_prefill_from`` tokens or more where the registry chose torch's SDPA (AMX CPUs when the kernel
  cannot use the tiles); without the kernel one SDPA per chunk with a causal mask offset by the prefix length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from . import kernels
from .kernels import registry
from .runner_pointwise import pick

if TYPE_CHECKING:
    from .runner import StepBatch


class AttentionMixin:
    """Attention over the KV cache for :class:`~inference.engine.runner.ModelRunner` (which sets the attributes
    annotated here at load time)."""

    device: torch.device
    num_heads: int
    num_kv_heads: int
    head_dim: int
    n_rep: int
    scale: float
    decode_kernel: Any
    prefill_kernel: Any
    sdpa_prefill_from: int | None
    dtype: torch.dtype
    _arange: torch.Tensor
    _zero: torch.Tensor
    _neg_inf: torch.Tensor

    def _choose_attention(self, native: bool) -> None:
        """Decode and prefill attention: the registry's choice, once (prefill by chunk length)."""
        shape = {"head_dim": self.head_dim, "n_rep": self.n_rep}
        decode = kernels.decode_attention() if native else None
        fits = decode is not None and decode.supports(self.dtype, **shape)
        name, fn = pick(
            "decode_attention", self.dtype, native, {"decode_attention": fits and decode, "torch": "sdpa"}
        )
        self.decode_kernel = fn if name == "decode_attention" else None
        prefill = kernels.prefill_attention() if native else None
        fits = prefill is not None and prefill.supports(self.dtype, **shape)
        builds = {
            "prefill_attention_amx": fits and prefill.uses_amx(self.head_dim) and prefill,
            "prefill_attention": fits and prefill,
            "sdpa_gqa": "sdpa_gqa",
            "torch": "sdpa",
        }
        bands = registry.choose(
            "prefill_attention", self.dtype, lambda e: builds[e.name] or None, native=native
        )
        self.prefill_bands = [(upto, entry.name) for upto, entry, _ in bands]
        self.prefill_kernel = next((fn for _, e, fn in bands if e.name.startswith("prefill_attention")), None)
        #: Prefill chunks of this many tokens or more attend through SDPA instead of the native kernel (AMX CPUs, bf16,
        #: where the kernel cannot use the tiles: its AVX-512 dot products lose to torch's AMX flash attention).
        self.sdpa_prefill_from: int | None = None
        for (below, _, _), (_, entry, _) in zip([(0, None, None), *bands], bands, strict=False):
            if entry.name == "sdpa_gqa" and self.prefill_kernel is not None:
                self.sdpa_prefill_from = (below or 0) + 1
                break

    def _mask(self, keep: torch.Tensor) -> torch.Tensor:
        return torch.where(keep, self._zero, self._neg_inf)

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
