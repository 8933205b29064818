"""Prefix cache: the K/V of finished requests, kept in token blocks keyed by a salted hash chain.

After vLLM's Automatic Prefix Caching (block hash = hash(parent hash, block tokens, extra keys such as
``cache_salt``) and SGLang's RadixAttention (reuse the KV of a shared prompt prefix across requests). A
conversation's next turn re-sends the whole history; with this cache only the new tail is prefilled.

* **Keys.** A prompt is cut into full blocks of ``block_size`` tokens. Block ``i``'s key is
  ``blake2b(key[i-1] || tokens of block i)`` with ``key[-1] = blake2b(salt)``, so a key names the whole
  prefix up to and including its block, and requests with different salts never share an entry (per-user
  isolation: one user's TTFT can never reveal whether another user sent a prompt). A cryptographic hash,
  as vLLM switched to, so colliding prefixes cannot be crafted.
* **Storage.** A pool of ``[num_layers, 2 (K, V), num_kv_heads, block_size, head_dim]`` blocks in lazily committed
  memory whose evicted blocks go back to the OS at once, apart from the slot cache (:mod:`.kv_cache`), whose slots
  are compacted and reused: a hit is *copied* into the new request's slot (a few MB per thousand tokens, far
  cheaper than prefilling them).
* **Eviction.** Least recently used block first, within ``capacity_tokens``, and sooner when the engine needs the
  memory for running requests (:meth:`PrefixCache.evict_to`, ``EngineConfig.kv_cache_memory_mb``). A hit touches its blocks from
  the last to the first, so a prefix's first blocks are always more recent than its later ones and eviction
  removes chain tails before the heads they hang from (an evicted head would make its tail unreachable).
* **Correctness.** A cached block holds exactly the K/V the same tokens at the same positions produce (K/V
  of position ``p`` depend only on tokens ``0..p``), so generation is unchanged up to float rounding of
  different matmul shapes, the same as chunked prefill; greedy outputs in float32 are tested identical.

Not thread-safe: :class:`~inference.engine.LLMEngine` calls it under its lock from the loop thread.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict

import torch

from .kv_cache import KVCache, lazy_zeros, release_pages


def block_keys(
    token_ids: list[int], salt: str | None, block_size: int, max_blocks: int | None = None
) -> list[bytes]:
    """Chain keys of the full blocks of ``token_ids`` (at most ``max_blocks``), 16 bytes each.

    ``salt=None`` and ``salt=""`` are the same (unsalted, shared) namespace.
    """
    n = len(token_ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    key = hashlib.blake2b((salt or "").encode("utf-8"), digest_size=16, person=b"chatsite-prefix").digest()
    keys = []
    for i in range(n):
        block = array("q", token_ids[i * block_size : (i + 1) * block_size]).tobytes()
        key = hashlib.blake2b(key + block, digest_size=16).digest()
        keys.append(key)
    return keys


class PrefixCache:
    """LRU store of K/V blocks keyed by :func:`block_keys`, in a pool of ``capacity_tokens // block_size`` blocks.

    The pool is one lazily committed ``[blocks, num_layers, 2 (K, V), num_kv_heads, block_size, head_dim]`` tensor
    (:func:`.kv_cache.lazy_zeros`, vLLM's block pool): a block's pages are committed when it is first written and
    handed back to the OS (``madvise``) the moment it is evicted, so resident memory is exactly the blocks held. (Blocks
    as tensors of their own lived on the malloc heap between the steps' activations; freed, they left the heap
    fragmented, ~60 MB that ``malloc_trim`` could not return after a mixed workload.)

    Args:
        kv: The slot cache to copy blocks from (on insert) and into (on a hit); fixes the geometry.
        block_size: Tokens per block.
        capacity_tokens: Most tokens held (``capacity_tokens // block_size`` blocks).

    Attributes:
        hit_tokens_total: Prompt tokens served from the cache since start (monotonic).
        query_tokens_total: Prompt tokens looked up since start (hit rate = hit / query).
    """

    #: Cached blocks copied into a slot per group on a hit (bounds the copy's temporary memory).
    LOAD_GROUP = 16

    def __init__(self, kv: KVCache, block_size: int, capacity_tokens: int) -> None:
        self.kv = kv
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        k0 = kv.k[0]
        shape = (self.capacity_blocks, kv.num_layers, 2, k0.shape[1], block_size, k0.shape[3])
        self._pool, self._map = (
            lazy_zeros(shape, k0.dtype, k0.device) if self.capacity_blocks else (k0.new_empty(shape), None)
        )
        self._block_bytes = math.prod(shape[1:]) * k0.element_size()
        #: Key -> the block's index in the pool, least recently used first.
        self._blocks: OrderedDict[bytes, int] = OrderedDict()
        self._free: list[int] = []
        self.clear()
        self.hit_tokens_total = 0
        self.query_tokens_total = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0

    @property
    def num_tokens(self) -> int:
        """Tokens currently held."""
        return len(self._blocks) * self.block_size

    def block(self, key: bytes) -> torch.Tensor | None:
        """The cached ``[num_layers, 2, num_kv_heads, block_size, head_dim]`` K/V of ``key`` (a view), or ``None``."""
        index = self._blocks.get(key)
        return None if index is None else self._pool[index]

    def load_prefix(self, token_ids: list[int], salt: str | None, slot: int) -> int:
        """Copy the longest cached prefix of ``token_ids`` into ``slot`` (positions ``0..n-1``).

        The last prompt token is never served from the cache: its forward pass yields the logits of the
        first generated token. Returns ``n``, the number of tokens whose K/V are now in the slot (a
        multiple of ``block_size``, possibly 0).
        """
        self.query_tokens_total += len(token_ids)
        if not self.enabled:
            return 0
        hits: list[bytes] = []
        for key in block_keys(token_ids, salt, self.block_size, (len(token_ids) - 1) // self.block_size):
            if key not in self._blocks:
                break
            hits.append(key)
        if not hits:
            return 0
        for key in reversed(hits):  # heads end up most recent: tails are evicted first
            self._blocks.move_to_end(key)
        n = len(hits) * self.block_size
        B = self.block_size
        # LOAD_GROUP blocks at a time: [g, L, 2, H, B, D] gathered from the pool, then K and V copied into the slot's
        # positions of every layer at once, viewed as [L, H, g, B, D]. One group is the only extra memory (a whole
        # 1500-token hit gathered and re-laid-out at once took twice its K/V, ~140 MB in float32 for the default model).
        for first in range(0, len(hits), self.LOAD_GROUP):
            indices = [self._blocks[k] for k in hits[first : first + self.LOAD_GROUP]]
            group = self._pool[torch.tensor(indices, device=self._pool.device)]
            g, L, _, H, _, D = group.shape
            start, end = first * B, (first + g) * B
            for kv_index, stack in enumerate((self.kv.k_stack, self.kv.v_stack)):
                stack[:, slot, :, start:end].view(L, H, g, B, D).copy_(
                    group[:, :, kv_index].permute(1, 2, 0, 3, 4)
                )
        self.hit_tokens_total += n
        return n

    def insert(self, token_ids: list[int], salt: str | None, slot: int, num_cached: int) -> int:
        """Keep the full blocks of ``token_ids[:num_cached]`` whose K/V sit in ``slot``.

        Blocks already cached are only touched. A full pool gives its least recently used blocks to the new ones; a
        request longer than the whole pool keeps its first blocks. Returns the number of newly stored blocks.
        """
        if not self.enabled:
            return 0
        keys = block_keys(token_ids[:num_cached], salt, self.block_size, self.capacity_blocks)
        if not keys:
            return 0
        first_new = 0
        while first_new < len(keys) and keys[first_new] in self._blocks:
            first_new += 1
        for key in keys[:first_new]:  # the cached head is not what a full pool gives away
            self._blocks.move_to_end(key)
        B = self.block_size
        new = keys[first_new:]
        for group in range(first_new, len(keys), self.LOAD_GROUP):
            # Up to LOAD_GROUP new blocks at a time, K and V of every layer each copied once, straight from the slot
            # into the group's pool rows.
            group_keys = keys[group : group + self.LOAD_GROUP]
            start, end = group * B, (group + len(group_keys)) * B
            indices = []
            for key in group_keys:
                if key in self._blocks:  # a later block of a chain whose earlier block was evicted
                    index = self._blocks[key]
                elif self._free:
                    index = self._free.pop()
                else:  # reuse the least recently used block's storage as it is (no page hand-back)
                    _, index = self._blocks.popitem(last=False)
                self._blocks[key] = index
                indices.append(index)
            self._store(indices, slot, start, end)
        for key in reversed(keys):
            self._blocks.move_to_end(key)
        return len(new)

    def _store(self, rows: list[int], slot: int, start: int, end: int) -> None:
        """Copy positions ``[start, end)`` of ``slot`` (``len(rows)`` whole blocks) into pool ``rows``, in order: K and V
        of every layer in one copy each, from the slot's strided view into the pool's block-major rows. Consecutive
        rows (a fresh pool hands them out in order, and reusing the least recently used blocks often gives back
        blocks stored together) take a plain strided copy; others one indexed copy (``index_put_``). Either way the
        bytes are moved once, where gathering them into a temporary ``[n, L, 2, H, B, D]`` span first, then
        ``index_copy_`` into the pool, moved them twice (``python -m devtools.bench.finish_probe``;
        docs/overhead-levers.md, lever 62)."""
        n = len(rows)
        L, H, B, D = self.kv.num_layers, self._pool.shape[3], self.block_size, self._pool.shape[5]
        first = rows[0]
        consecutive = rows == list(range(first, first + n))
        index = None if consecutive else torch.tensor(rows, device=self._pool.device)
        for kv_index, stack in enumerate((self.kv.k_stack, self.kv.v_stack)):  # every layer at once
            # [n, L, H, B, D]: the slot's positions as whole blocks, block-major as the pool's rows (a strided view)
            blocks = stack[:, slot, :, start:end].view(L, H, n, B, D).permute(2, 0, 1, 3, 4)
            if index is None:
                self._pool[first : first + n, :, kv_index].copy_(blocks)
            else:
                self._pool[index, :, kv_index] = blocks

    def evict_to(self, max_tokens: int) -> int:
        """Evict least recently used blocks until at most ``max_tokens`` tokens are held, handing their pages back to
        the OS at once; returns the tokens evicted.

        Used by the engine's resident-memory target (``EngineConfig.kv_cache_memory_mb``): cached blocks give way to
        the running requests' K/V, as vLLM's cached blocks are reused for new allocations when its block pool is full.
        """
        evicted = 0
        while self._blocks and len(self._blocks) * self.block_size > max(0, max_tokens):
            _, index = self._blocks.popitem(last=False)
            self._release(index)
            evicted += self.block_size
        return evicted

    def clear(self) -> None:
        """Drop every block and hand the memory they held back to the OS (the whole pool in one ``madvise``)."""
        if self._map is not None:
            release_pages(self._map, 0, self.capacity_blocks * self._block_bytes)
        self._blocks.clear()
        self._free = list(range(self.capacity_blocks - 1, -1, -1))

    def _release(self, index: int) -> None:
        if self._map is not None:
            release_pages(self._map, index * self._block_bytes, (index + 1) * self._block_bytes)
        self._free.append(index)
