"""The page's retry policy per tier (paid: linear; free: exponential, capped), from the tier's fields."""

from types import SimpleNamespace

from billing.defaults import DEFAULT_TIERS
from billing.selectors import backoff_delay_s, tier_backoff


def test_default_paid_tier_retries_every_10_s_and_free_backs_off_10_20_40_to_160():
    paid = tier_backoff(tier=SimpleNamespace(**DEFAULT_TIERS["paid"]))
    free = tier_backoff(tier=SimpleNamespace(**DEFAULT_TIERS["free"]))
    assert paid == {"kind": "linear", "base_s": 10, "cap_s": 10}
    assert free == {"kind": "exponential", "base_s": 10, "cap_s": 160}
    assert [backoff_delay_s(paid, k) for k in range(4)] == [10, 10, 10, 10]
    assert [backoff_delay_s(free, k) for k in range(7)] == [10, 20, 40, 80, 160, 160, 160]


def test_server_retry_after_is_a_floor():
    free = tier_backoff(tier=SimpleNamespace(**DEFAULT_TIERS["free"]))
    assert backoff_delay_s(free, 0, retry_after=33) == 33
    assert backoff_delay_s(free, 3, retry_after=33) == 80


def test_operator_edited_backoff_is_used():
    tier = SimpleNamespace(queue_priority=0, backoff_kind="linear", backoff_base_s=5, backoff_cap_s=0)
    assert tier_backoff(tier=tier) == {"kind": "linear", "base_s": 5, "cap_s": 5}


def test_tier_without_backoff_fields_falls_back_on_its_priority():
    assert tier_backoff(tier=SimpleNamespace(queue_priority=10))["kind"] == "linear"
    assert tier_backoff(tier=SimpleNamespace(queue_priority=0))["cap_s"] == 160
