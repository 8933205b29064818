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


def test_freed_pages_are_kept_within_the_allowance_and_discarded_past_it():
    kv = KVCache(2, 2, 64, 3, 4096, 8192, torch.float32, torch.device("cpu"), retain_tokens=500)
    a, b, c = Owner(), Owner(), Owner()
    assert kv.try_allocate(a, 300) and kv.try_allocate(b, 200)
    kv.k[0][1, :, :200] = 2.0
    kv.release(
        b
    )  # 200 stale positions <= 500: the slot keeps its pages (its next user writes without faults)
    assert kv.stale_tokens == 200 and kv.k[0][1, :, :200].min() == 2.0
    assert kv.try_allocate(c, 900) and c.slot == 1
    kv.k[0][1, :, :900] = 3.0
    c.num_cached = 900
    kv.release(a)  # c moves into slot 0; slot 1 (900) and slot 0's old pages would make 900 stale > 500
    assert c.slot == 0 and kv.stale_tokens == 0
    assert kv.k[0][1].abs().sum() == 0  # the vacated slot handed back at once
    assert kv.k[0][0, :, :900].min() == 3.0  # the mover's copied positions intact


def test_discard_stale_returns_every_page_no_running_request_reserved():
    kv = _cache()
    a, b = Owner(), Owner()
    assert kv.try_allocate(a, 300) and kv.try_allocate(b, 200)
    for layer in range(2):
        kv.k[layer][:2, :, :300] = 1.0
    kv.release(b)  # within the allowance: slot 1 keeps its pages
    assert kv.stale_tokens == 200 and kv.k[0][1].abs().sum() > 0
    kv.discard_stale()
    assert kv.stale_tokens == 0
    for layer in range(2):
        assert kv.k[layer][1].abs().sum() == 0  # vacated slot handed back
        assert kv.k[layer][0, :, 304:].abs().sum() == 0  # a's pages past its reservation (page-rounded)
        assert kv.k[layer][0, :, :300].abs().sum() > 0  # a's reserved positions untouched


class _CountCalls(torch.overrides.TorchFunctionMode):
    """Counts the tensor methods called inside the block, by name."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def test_layers_share_one_tensor_and_compaction_and_the_prefix_cache_copy_all_layers_at_once():
    """Every layer's K (and V) is a view of one ``[layers, slots, heads, slot_len, head_dim]`` tensor, so a finished
    request's slot is refilled, and its blocks kept by the prefix cache, with one copy for K and one for V whatever
    the number of layers (docs/overhead-levers.md, lever 53): one copy per layer was 60 small copies per finish for
    the default model's 30 layers."""
    from inference.engine.prefix_cache import PrefixCache

    layers = 6
    kv = KVCache(layers, 2, 64, 3, 256, 768, torch.float32, torch.device("cpu"))
    assert all(
        kv.k[i].data_ptr() == kv.k_stack[i].data_ptr() and kv.k[i].is_contiguous() for i in range(layers)
    )
    done, mover = Owner(), Owner()
    assert kv.try_allocate(done, 100) and kv.try_allocate(mover, 100)
    mover.num_cached = done.num_cached = 48
    for layer in range(layers):
        kv.k[layer][mover.slot, :, :48] = float(layer + 1)
        kv.v[layer][mover.slot, :, :48] = -float(layer + 1)
        kv.k[layer][done.slot, :, :48] = 10.0 * (layer + 1)
    cache = PrefixCache(kv, block_size=16, capacity_tokens=256)
    with _CountCalls() as counted:
        assert cache.insert(list(range(48)), "user:1", done.slot, 48) == 3
    # A fresh pool hands out consecutive rows: one strided copy each for K and V, no gather first (lever 62).
    assert counted.calls.get("copy_", 0) == 2 and counted.calls.get("index_copy_", 0) == 0, counted.calls
    assert all(
        cache.block(key)[layer, 0].min() == 10.0 * (layer + 1)
        for key in cache._blocks
        for layer in range(layers)
    )
    with _CountCalls() as counted:
        kv.release(done)
    assert counted.calls.get("copy_", 0) == 2, counted.calls
    assert mover.slot == 0
    for layer in range(layers):
        assert kv.k[layer][0, :, :48].min() == kv.k[layer][0, :, :48].max() == float(layer + 1)
        assert kv.v[layer][0, :, :48].max() == -float(layer + 1)
    again = Owner()
    assert kv.try_allocate(again, 100)
    with _CountCalls() as counted:
        assert cache.load_prefix(list(range(49)), "user:1", again.slot) == 48
    assert counted.calls.get("copy_", 0) == 2, counted.calls
    assert all(kv.k[layer][again.slot, :, :48].min() == 10.0 * (layer + 1) for layer in range(layers))


def _filled(kv: KVCache, owners: list[Owner], written: int) -> None:
    """Allocate every owner and write ``written`` positions of its slot with its own index."""
    for i, owner in enumerate(owners):
        assert kv.try_allocate(owner, written + 10)
        owner.num_cached = written
        for layer in range(2):
            kv.k[layer][owner.slot, :, :written] = float(i + 1)
            kv.v[layer][owner.slot, :, :written] = -float(i + 1)


def test_release_many_moves_each_survivor_at_most_once_and_keeps_its_kv(monkeypatch):
    kv = _cache(slots=8, slot_len=256, budget=8 * 256)
    owners = [Owner() for _ in range(8)]
    _filled(kv, owners, 100)
    copies = []
    real_copy = torch.Tensor.copy_

    def counting_copy(self, src, *args, **kwargs):
        copies.append(tuple(src.shape))
        return real_copy(self, src, *args, **kwargs)

    finished = [owners[i] for i in (0, 2, 3, 5, 7)]  # slots 1, 4 and 6 go on running
    monkeypatch.setattr(torch.Tensor, "copy_", counting_copy)
    kv.release_many(finished)
    monkeypatch.undo()
    # Three slots stay active; of the survivors only slots 4 and 6 lay past the new end: one copy each for K and V.
    assert kv.num_active == 3 and len(copies) == 4
    assert kv.used_tokens == 3 * 110 and all(o.slot == -1 for o in finished)
    survivors = {i: owners[i] for i in (1, 4, 6)}
    assert sorted(o.slot for o in survivors.values()) == [0, 1, 2] and survivors[1].slot == 1
    for i, owner in survivors.items():
        for layer in range(2):
            assert kv.k[layer][owner.slot, :, :100].eq(float(i + 1)).all()
            assert kv.v[layer][owner.slot, :, :100].eq(-float(i + 1)).all()
    # One at a time, the same finishes cost one copy each for K and V per finish below the last slot.
    kv2 = _cache(slots=8, slot_len=256, budget=8 * 256)
    owners2 = [Owner() for _ in range(8)]
    _filled(kv2, owners2, 100)
    copies.clear()
    monkeypatch.setattr(torch.Tensor, "copy_", counting_copy)
    for i in (0, 2, 3, 5, 7):
        kv2.release(owners2[i])
    monkeypatch.undo()
    assert len(copies) > 4 and kv2.num_active == 3 and kv2.used_tokens == kv.used_tokens


def test_release_many_skips_owners_without_an_active_slot_and_frees_the_rest():
    kv = _cache(slots=4, slot_len=256, budget=4 * 256)
    a, b, c = Owner(), Owner(), Owner()
    _filled(kv, [a, b, c], 50)
    kv.release(a)  # c moved into slot 0
    stranger = Owner()
    kv.release_many([a, stranger, b])  # a is already free, the stranger never held a slot
    assert (kv.num_active, kv.used_tokens, b.slot, c.slot) == (1, 60, -1, 0)
    assert kv.k[0][0, :, :50].eq(3.0).all()
    kv.release_many([])
    kv.release_many([c])
    assert (kv.num_active, kv.used_tokens, c.slot) == (0, 0, -1)


def test_the_prefix_cache_stores_blocks_in_scattered_rows_with_one_indexed_copy_each_for_k_and_v():
    """Rows that are not consecutive (a pool whose blocks were evicted and reused out of order) take one indexed copy
    each for K and V, straight from the slot, and every block lands in its own row (lever 62)."""
    from inference.engine.prefix_cache import PrefixCache

    layers = 4
    kv = KVCache(layers, 2, 64, 2, 256, 512, torch.float32, torch.device("cpu"))
    done = Owner()
    assert kv.try_allocate(done, 100)
    done.num_cached = 48
    for layer in range(layers):
        for block in range(3):  # each block's positions hold its own number, K positive and V negative
            kv.k[layer][done.slot, :, block * 16 : (block + 1) * 16] = 100.0 * layer + block
            kv.v[layer][done.slot, :, block * 16 : (block + 1) * 16] = -(100.0 * layer + block)
    cache = PrefixCache(kv, block_size=16, capacity_tokens=256)
    cache._free = [9, 2, 7]  # pops 7, 2, 9: the chain's blocks in scattered rows
    with _CountCalls() as counted:
        assert cache.insert(list(range(48)), "user:1", done.slot, 48) == 3
    assert counted.calls.get("__setitem__", 0) == 2 and counted.calls.get("copy_", 0) == 0, counted.calls
    assert sorted(cache._blocks.values()) == [2, 7, 9]
    again = Owner()
    assert kv.try_allocate(again, 100)
    assert cache.load_prefix(list(range(49)), "user:1", again.slot) == 48
    for layer in range(layers):
        for block in range(3):
            positions = slice(block * 16, (block + 1) * 16)
            assert kv.k[layer][again.slot, :, positions].eq(100.0 * layer + block).all()
            assert kv.v[layer][again.slot, :, positions].eq(-(100.0 * layer + block)).all()
