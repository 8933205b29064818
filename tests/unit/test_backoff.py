"""The page's retry policy per tier (paid: linear; free: exponential, capped)."""

from types import SimpleNamespace

from billing.selectors import tier_backoff


def test_paid_tiers_retry_linearly_and_free_tiers_back_off_exponentially():
    assert tier_backoff(tier=SimpleNamespace(queue_priority=10)) == {
        "kind": "linear",
        "base_s": 10,
        "cap_s": 10,
    }
    assert tier_backoff(tier=SimpleNamespace(queue_priority=0)) == {
        "kind": "exponential",
        "base_s": 10,
        "cap_s": 160,
    }
