"""Preallocated slot-based KV cache with token-budget accounting.

Layout: per layer one K and one V tensor of shape ``[num_slots, num_kv_heads, slot_len,
head_dim]``. Each running request owns one *slot* (a row) and writes the K/V of position ``p``
at ``[slot, :, p, :]`` in place (no ``torch.cat`` growth as in ``transformers``' DynamicCache).

Why slots rather than vLLM's paged blocks: on CPU we have no paged-attention kernel, so decode
attention must see each sequence's keys contiguously. Gathering blocks into a contiguous buffer
every step would copy the whole KV working set (~190 MB/step at 32 x 256 tokens for the
default model in bf16) on top of reading it. With slots, the decode batch reads
``k[:n_active, :, :max_len]`` as a strided *view*. Active slots are kept compact (a finished
request's slot is refilled by moving the highest active slot into it), so the decode batch never
has holes.

Memory: slot rows are ``slot_len`` long (up to the context length) but on CPU the tensors live
in an anonymous ``mmap``: pages cost no RSS until written and read as zeros (finite values are
required: masked attention still multiplies them by 0). Pages of freed slots (or past a request's
reservation) are handed back with ``madvise(MADV_DONTNEED)`` once they exceed ``retain_tokens`` positions
beyond the running requests' reservations, and all of them when the engine goes idle
(:meth:`KVCache.discard_stale`): resident KV memory tracks the running requests plus that allowance. Why keep
some: a fresh page costs a fault and the kernel zeroing it on its first write, and a 4096-token prefill
writes ~23 000 pages (bf16, default model): discarding every freed slot at once made an N=32 burst's prefill
~6 % slower on the 2-core box (1.30 against 1.23 s).
(``numpy.zeros``/THP-backed memory was tried first: every first write then faults a 2 MiB huge
page, which made prefill 10x slower.) Admission control uses a separate *token budget*: each
request reserves ``prompt + max_new_tokens`` tokens (:meth:`KVCache.try_allocate`), so the
memory actually written stays bounded by the budget.

Prefix caching lives apart (:mod:`.prefix_cache`): a finished request's K/V are copied out of its slot into
blocks, and a later prompt's cached prefix is copied back in. The engine keeps the running requests' K/V
(:attr:`KVCache.written_tokens`), the retained freed pages (:attr:`KVCache.stale_tokens`) and those blocks within
one resident-memory target (``EngineConfig.kv_cache_memory_mb``, see ``LLMEngine``).
"""

from __future__ import annotations

import math
import mmap
import sys
from collections.abc import Iterable
from typing import Protocol

import torch

_PAGE = mmap.PAGESIZE
# Reserve address space only: the cache is sized for the worst case and mostly never touched, so
# it must not count against a strict overcommit limit. (Python's mmap module lacks the constant.)
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


class SlotOwner(Protocol):
    """What the cache needs to know about a request that owns a slot."""

    slot: int
    num_cached: int  # tokens whose K/V are written in the slot (positions 0..num_cached-1)


def lazy_zeros(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, mmap.mmap | None]:
    """Zero tensor whose CPU pages are only committed when first written (also the prefix cache's block pool).

    Returns the tensor and, on CPU, the anonymous mapping backing it (for :func:`release_pages`).
    """
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device), None
    itemsize = torch.empty((), dtype=dtype).element_size()
    buf = mmap.mmap(
        -1, max(1, math.prod(shape) * itemsize), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
    )
    tensor = torch.frombuffer(buf, dtype=torch.uint8, count=math.prod(shape) * itemsize)
    return tensor.view(dtype).view(shape), buf


def release_pages(buf: mmap.mmap, start: int, end: int) -> None:
    """Hand the whole pages inside bytes ``[start, end)`` of ``buf`` back to the OS (``madvise(MADV_DONTNEED)``);
    they read as zeros afterwards."""
    start = -(-start // _PAGE) * _PAGE
    end = end // _PAGE * _PAGE
    if end > start:
        buf.madvise(mmap.MADV_DONTNEED, start, end - start)


class KVCache:
    """K/V storage for ``num_slots`` concurrent sequences plus a reservation budget.

    Args:
        num_layers, num_kv_heads, head_dim: Model geometry.
        num_slots: Maximum concurrent sequences (``EngineConfig.max_num_seqs``).
        slot_len: Maximum tokens per sequence (prompt + generated).
        budget_tokens: Sum of reservations allowed across slots (``kv_used_tokens`` limit).
        dtype, device: Storage dtype (the model dtype) and device.
        retain_tokens: Positions of freed pages kept resident beyond the running requests' reservations
            (``None``: a quarter of ``budget_tokens``, at most :attr:`RETAIN_TOKENS`); see the module docstring.

    Attributes:
        k_stack, v_stack: Every layer's K (V) in one ``[num_layers, num_slots, num_kv_heads, slot_len, head_dim]``
            tensor, so that moving a slot's K/V (compaction, the prefix cache's copies) is one strided copy for
            all layers instead of one per layer: each such small copy costs more in dispatch, and in giving up
            and retaking the GIL beside the worker's other threads, than in bytes moved.
        k, v: Lists (one per layer) of ``[num_slots, num_kv_heads, slot_len, head_dim]`` views of those
            (contiguous: what the forward pass writes and attention reads).
        num_active: Active slots are exactly ``0 .. num_active - 1``.
    """

    #: Default cap of :attr:`retain_tokens`.
    RETAIN_TOKENS = 4096

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_slots: int,
        slot_len: int,
        budget_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
        retain_tokens: int | None = None,
    ) -> None:
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.slot_len = slot_len
        self.budget_tokens = budget_tokens
        #: Positions of written pages kept beyond the running requests' reservations (stale until reused): by
        #: default a quarter of the budget, at most RETAIN_TOKENS (94 MB of bf16 K/V for the default model).
        if retain_tokens is None:
            retain_tokens = min(budget_tokens // 4, self.RETAIN_TOKENS)
        self.retain_tokens = max(0, retain_tokens)
        shape = (num_slots, num_kv_heads, slot_len, head_dim)
        self.k_stack, k_map = lazy_zeros((num_layers, *shape), dtype, device)
        self.v_stack, v_map = lazy_zeros((num_layers, *shape), dtype, device)
        self.k: list[torch.Tensor] = list(self.k_stack.unbind(0))
        self.v: list[torch.Tensor] = list(self.v_stack.unbind(0))
        self._maps: list[mmap.mmap] = [buf for buf in (k_map, v_map) if buf is not None]
        self.num_kv_heads = num_kv_heads
        self._row_bytes = head_dim * torch.empty((), dtype=dtype).element_size()
        #: Bytes of K/V one token position takes over all layers (K and V, every KV head).
        self.bytes_per_token = 2 * num_layers * num_kv_heads * self._row_bytes
        self._slot_bytes = num_kv_heads * slot_len * self._row_bytes
        #: Bytes of one layer's K (or V) in its map: layer ``i``'s bytes start at ``i * _layer_bytes``.
        self._layer_bytes = num_slots * self._slot_bytes
        self._owners: list[SlotOwner | None] = [None] * num_slots
        self._reserved = [0] * num_slots
        # Upper bound of positions that may hold committed (resident) pages, per slot.
        self._high_water = [0] * num_slots
        self.num_active = 0
        self.used_tokens = 0

    def can_allocate(self, tokens: int) -> bool:
        return self.num_active < self.num_slots and self.used_tokens + tokens <= self.budget_tokens

    def try_allocate(self, owner: SlotOwner, tokens: int) -> bool:
        """Give ``owner`` the next slot and reserve ``tokens``; ``False`` if no room.

        Sets ``owner.slot``. ``owner.num_cached`` is left as is (0 for a fresh request; the
        prefix-cache seam would set it to the reused prefix length).
        """
        if not self.can_allocate(tokens):
            return False
        slot = self.num_active
        self.num_active += 1
        self._owners[slot] = owner
        self._reserved[slot] = tokens
        self._high_water[slot] = max(self._high_water[slot], tokens)
        self.used_tokens += tokens
        owner.slot = slot
        return True

    def release(self, owner: SlotOwner) -> None:
        """Free ``owner``'s slot and reservation; compact by moving the last active slot into it.

        The moved request's ``slot`` attribute is updated; its first ``num_cached`` positions are
        copied (one strided copy for K and one for V, all layers at once). Pages the mover will never use (past its
        reservation, left over from the freed request) and the whole vacated last slot are
        returned to the OS, so resident KV memory stays within the reservations of running
        requests. :meth:`release_many` of one owner.
        """
        self.release_many((owner,))

    def release_many(self, owners: Iterable[SlotOwner]) -> None:
        """Free several owners' slots and reservations at once (the requests one engine step finished), then compact:
        each surviving request in a slot at or past the new ``num_active`` moves once into a freed slot below it.

        :meth:`release`, one owner after another, moves the last active slot's request into each freed slot; in a
        step that ends most of a batch (a wave of replies of one length) that request is often one finishing in the
        same step, moved only to be freed or moved again: one K/V copy per finished request. Here the copies are at
        most one per surviving request above the new end. Afterwards the state is :meth:`release`'s: slots ``0 ..
        num_active - 1`` active, each mover's ``slot`` updated, each freed owner's ``slot`` -1. Owners not holding
        an active slot are skipped.
        """
        freed = []
        for owner in owners:
            slot = owner.slot
            if slot < 0 or slot >= self.num_active or self._owners[slot] is not owner:
                continue
            self.used_tokens -= self._reserved[slot]
            self._owners[slot] = None
            self._reserved[slot] = 0
            owner.slot = -1
            freed.append(slot)
        if not freed:
            return
        active = self.num_active - len(freed)
        holes = sorted(slot for slot in freed if slot < active)
        movers = [slot for slot in range(active, self.num_active) if self._owners[slot] is not None]
        for hole, last in zip(holes, movers, strict=True):
            mover = self._owners[last]
            n = mover.num_cached
            if n > 0:  # every layer's positions in one copy each for K and V
                self.k_stack[:, hole, :, :n].copy_(self.k_stack[:, last, :, :n])
                self.v_stack[:, hole, :, :n].copy_(self.v_stack[:, last, :, :n])
            self._owners[hole] = mover
            self._reserved[hole] = self._reserved[last]
            mover.slot = hole
            self._high_water[hole] = max(self._high_water[hole], self._reserved[hole])
            self._owners[last] = None
            self._reserved[last] = 0
        self.num_active = active
        if self.stale_tokens > self.retain_tokens:
            self.discard_stale()

    @property
    def written_tokens(self) -> int:
        """Positions the running requests have written (the sum of their ``num_cached``): their resident K/V."""
        return sum(owner.num_cached for owner in self._owners[: self.num_active] if owner is not None)

    @property
    def stale_tokens(self) -> int:
        """Positions whose pages may be resident without belonging to a running request's reservation."""
        return sum(self._high_water) - self.used_tokens

    def discard_stale(self) -> None:
        """Return to the OS the pages no running request has reserved: every inactive slot's and the tail of an
        active slot past its reservation (they read as zeros afterwards). Called when the stale positions
        exceed ``retain_tokens`` and by the engine when it goes idle."""
        for slot in range(self.num_slots):
            keep = self._reserved[slot] if slot < self.num_active else 0
            if self._high_water[slot] <= keep:
                continue
            if keep == 0:
                self._discard_pages(slot)
            else:
                self._discard_tail(slot, keep)
            self._high_water[slot] = keep

    def _madvise_free(self, start: int, end: int) -> None:
        """Hand back bytes ``[start, end)`` of every layer's K and V (offsets within one layer's tensor)."""
        for buf in self._maps:
            for layer in range(self.num_layers):
                base = layer * self._layer_bytes
                release_pages(buf, base + start, base + end)

    def _discard_pages(self, slot: int) -> None:
        """Return the memory of an unused slot to the OS; it reads as zeros afterwards."""
        if self._maps:
            self._madvise_free(slot * self._slot_bytes, (slot + 1) * self._slot_bytes)

    def _discard_tail(self, slot: int, first_token: int) -> None:
        """Return the pages of positions ``>= first_token`` of ``slot`` (every KV head)."""
        if not self._maps:
            return
        head_bytes = self.slot_len * self._row_bytes
        for head in range(self.num_kv_heads):
            base = (slot * self.num_kv_heads + head) * head_bytes
            self._madvise_free(base + first_token * self._row_bytes, base + head_bytes)

    def clear_slot_range(self, slot: int, end: int) -> None:
        """Zero positions ``[0, end)`` of a slot (used after a failed step so that garbage or
        NaNs can never leak into other requests through masked attention)."""
        self.k_stack[:, slot, :, :end].zero_()
        self.v_stack[:, slot, :, :end].zero_()
