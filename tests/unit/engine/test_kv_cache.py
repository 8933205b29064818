"""Slot allocation, budget accounting, compaction and page release of the KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.kv_cache import KVCache


@dataclass(eq=False)
class Owner:
    slot: int = -1
    num_cached: int = 0


def _cache(slots=3, slot_len=4096, budget=8192):
    # head_dim 64 x fp32 = 256 B rows: 16 positions per 4 KiB page.
    return KVCache(2, 2, 64, slots, slot_len, budget, torch.float32, torch.device("cpu"))


def test_allocation_respects_slots_and_budget():
    kv = _cache(slots=2, budget=1000)
    a, b, c = Owner(), Owner(), Owner()
    assert kv.try_allocate(a, 600) and a.slot == 0
    assert not kv.try_allocate(b, 500)  # budget
    assert kv.try_allocate(b, 400) and b.slot == 1
    assert not kv.try_allocate(c, 1)  # slots
    assert (kv.num_active, kv.used_tokens) == (2, 1000)
    kv.release(a)
    assert (kv.num_active, kv.used_tokens, a.slot) == (1, 400, -1)


def test_release_compacts_and_returns_memory():
    kv = _cache()
    big, small, last = Owner(), Owner(), Owner()
    for owner, reserve in ((big, 4000), (small, 100), (last, 500)):
        assert kv.try_allocate(owner, reserve)
    for layer in range(2):
        kv.k[layer][0, :, :4000] = 1.0
        kv.v[layer][0, :, :4000] = 1.0
        kv.k[layer][2, :, :300] = torch.arange(300, dtype=torch.float32).view(1, 300, 1)
    last.num_cached = 300
    kv.release(big)  # slot 2 ("last") moves into slot 0
    assert (last.slot, small.slot, kv.num_active) == (0, 1, 2)
    for layer in range(2):
        moved = kv.k[layer][0, :, :300]
        assert torch.equal(moved, torch.arange(300, dtype=torch.float32).view(1, 300, 1).expand_as(moved))
        # The freed request's data past the mover's reservation (500) was handed back: zeros.
        assert kv.k[layer][0, :, 512:].abs().sum() == 0
        assert kv.v[layer][0, :, 512:].abs().sum() == 0
        assert kv.k[layer][2].abs().sum() == 0  # vacated slot released entirely
