from datetime import timedelta

import pytest
from django.utils import timezone

from billing import selectors, services
from billing.models import Tier, UsageRecord

pytestmark = pytest.mark.django_db


def test_default_tiers_exist_and_differ():
    free, paid = Tier.objects.get(name="free"), Tier.objects.get(name="paid")
    assert paid.queue_priority > free.queue_priority
    assert paid.tokens_per_day > free.tokens_per_day
    assert paid.max_reply_tokens > free.max_reply_tokens
    assert free.max_reply_tokens < free.max_context_tokens
    assert paid.admit_max_wait_s > free.admit_max_wait_s


def test_usage_today_and_month_sum_only_that_users_records(alice, bob):
    services.usage_record_create(
        user=alice, message=None, model_name="m", prompt_tokens=10, completion_tokens=5
    )
    services.usage_record_create(
        user=alice, message=None, model_name="m", prompt_tokens=1, completion_tokens=2
    )
    services.usage_record_create(
        user=bob, message=None, model_name="m", prompt_tokens=100, completion_tokens=100
    )
    old = services.usage_record_create(
        user=alice, message=None, model_name="m", prompt_tokens=7, completion_tokens=0
    )
    UsageRecord.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=40))
    today = selectors.usage_today(user=alice)
    assert today == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18, "requests": 2}
    assert selectors.usage_this_month(user=alice)["total_tokens"] >= 18


def test_negative_usage_is_refused(alice):
    with pytest.raises(ValueError):
        services.usage_record_create(
            user=alice, message=None, model_name="m", prompt_tokens=-1, completion_tokens=0
        )
    assert UsageRecord.objects.count() == 0


def test_tiers_ensure_keeps_operator_edits():
    Tier.objects.filter(name="free").update(requests_per_minute=3)
    Tier.objects.filter(name="paid").delete()
    services.tiers_ensure()
    assert Tier.objects.get(name="free").requests_per_minute == 3
    assert Tier.objects.filter(name="paid").exists()
