"""Teams: the organisation's shared token pool, exact under concurrency like the per-user ledger
(tests/db/test_quota.py), optional per-member caps, and who may change a team."""

import threading

import pytest
from django.db import connection
from django.urls import reverse

from billing.models import DailyQuota, QuotaReservation, Tier
from billing.quota import quota_day, quota_status
from billing.subscription_models import PoolDailyQuota, Subscription
from billing.teams import team_join, team_remove
from conversations import generation_worker, generations
from conversations.admission import AdmissionRefused
from organizations.models import Membership, Role
from organizations.services import TeamError, invitation_create, membership_update, organization_create

LIMIT = 10_000
# A new one-word conversation reserves its prompt bound (2 bytes + 64 + 8 * 2 template tokens) + 100.
PER_REQUEST = 2 + 64 + 16 + 100


def paying_team(owner, *members, seats: int = 1):
    """A team of ``owner`` and ``members`` whose (synced) subscription grants the paid tier, with the paid
    tier's limits made small: the pool is ``LIMIT * seats`` tokens a day."""
    Tier.objects.filter(name="paid").update(
        tokens_per_day=LIMIT,
        max_reply_tokens=100,
        max_context_tokens=1000,
        max_concurrent_generations=100,
        requests_per_minute=1000,
    )
    paid = Tier.objects.get(name="paid")
    team = organization_create(name="acme", owner=owner)
    for m in members:
        Membership.objects.create(organization=team, user=m)
    Subscription.objects.create(
        organization=team,
        stripe_subscription_id="sub_acme",
        stripe_customer_id="cus_acme",
        status="active",
        tier=paid,
        seats=seats,
    )
    from billing.subscriptions import organization_tier_apply

    organization_tier_apply(organization_id=team.pk)
    return team


@pytest.mark.django_db(transaction=True)
def test_twenty_members_at_once_near_the_pool_limit_never_pass_it(make_user, redis_clean):
    people = [make_user(f"m{i:02d}") for i in range(20)]
    team = paying_team(people[0], *people[1:])
    PoolDailyQuota.objects.create(organization=team, day=quota_day(), used_tokens=LIMIT - 1000)
    results: list[object] = []
    barrier = threading.Barrier(20)

    def one(person):
        from accounts.models import User

        user = User.objects.select_related("tier").get(pk=person.pk)
        barrier.wait()
        try:
            results.append(generations.reply_request(user=user, conversation_id=None, content="hi"))
        except AdmissionRefused as exc:
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(p,)) for p in people]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    admitted = [r for r in results if isinstance(r, generations.ReplyTicket)]
    refused = [r for r in results if isinstance(r, AdmissionRefused)]
    assert len(admitted) == 1000 // PER_REQUEST == 5
    assert len(refused) == 15 and {r.code for r in refused} == {"quota_exceeded"}
    pool = PoolDailyQuota.objects.get(organization=team)
    assert pool.used_tokens + pool.reserved_tokens <= LIMIT
    assert (
        pool.reserved_tokens
        == 5 * PER_REQUEST
        == QuotaReservation.objects.filter(pool=pool).count() * PER_REQUEST
    )
    # Each admitted member's own row holds its share (usage per member); refused members hold nothing.
    assert (
        sorted(DailyQuota.objects.filter(reserved_tokens__gt=0).values_list("reserved_tokens", flat=True))
        == [PER_REQUEST] * 5
    )
    assert sum(DailyQuota.objects.values_list("reserved_tokens", flat=True)) == 5 * PER_REQUEST

    for ticket in admitted:
        message = generation_worker.generation_start(message_id=ticket.message.id)
        generation_worker.generation_finish(
            message=message, status="completed", text="ok", prompt_tokens=50, completion_tokens=100
        )
    pool.refresh_from_db()
    assert (pool.used_tokens, pool.reserved_tokens) == (LIMIT - 1000 + 5 * 150, 0)
    assert not QuotaReservation.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_member_cap_refuses_that_member_while_the_pool_still_serves_others(make_user, redis_clean):
    owner, capped, free_rider = make_user("owner"), make_user("capped"), make_user("other")
    team = paying_team(owner, capped, free_rider)
    membership_update(organization=team, user=capped, changed_by=owner, daily_token_cap=2 * PER_REQUEST)
    capped.refresh_from_db()
    for _ in range(2):
        generations.reply_request(user=capped, conversation_id=None, content="hi")
    with pytest.raises(AdmissionRefused) as refused:
        generations.reply_request(user=capped, conversation_id=None, content="hi")
    assert refused.value.code == "quota_exceeded"
    free_rider.refresh_from_db()
    generations.reply_request(user=free_rider, conversation_id=None, content="hi")
    pool = PoolDailyQuota.objects.get(organization=team)
    assert pool.reserved_tokens == 3 * PER_REQUEST  # the refused request left nothing on the pool
    assert quota_status(user=capped).remaining == 0
    assert quota_status(user=owner).remaining == LIMIT - 3 * PER_REQUEST  # members share one pool


@pytest.mark.django_db
def test_invited_member_joins_on_the_team_tier_and_leaves_to_free(make_user):
    owner, newcomer, outsider = make_user("owner"), make_user("newcomer"), make_user("outsider")
    team = paying_team(owner)
    with pytest.raises(TeamError):
        invitation_create(organization=team, email=outsider.email, invited_by=outsider)
    invitation = invitation_create(organization=team, email=newcomer.email, invited_by=owner)
    with pytest.raises(TeamError):  # sent to someone else
        team_join(token=invitation.token, user=outsider)
    team_join(token=invitation.token, user=newcomer)
    newcomer.refresh_from_db()
    assert newcomer.tier.name == "paid" and newcomer.membership.role == Role.MEMBER
    with pytest.raises(TeamError):  # used once
        team_join(token=invitation.token, user=newcomer)
    with pytest.raises(TeamError):  # a member cannot remove others
        team_remove(organization=team, user=owner, removed_by=newcomer)
    team_remove(organization=team, user=newcomer, removed_by=newcomer)
    newcomer.refresh_from_db()
    assert newcomer.tier.name == "free" and not Membership.objects.filter(user=newcomer).exists()


@pytest.mark.django_db
def test_owners_see_usage_per_member_members_and_outsiders_do_not(client, make_user):
    from billing.services import usage_record_create

    owner, member, outsider = make_user("owner"), make_user("member"), make_user("outsider")
    paying_team(owner, member)
    usage_record_create(user=member, message=None, model_name="m", prompt_tokens=30, completion_tokens=12)
    client.force_login(owner)
    page = client.get(reverse("billing:team"))
    assert [(r["username"], r["total_tokens"]) for r in page.context["usage_month"]] == [
        ("member", 42),
        ("owner", 0),
    ]
    client.force_login(member)
    page = client.get(reverse("billing:team"))
    assert page.status_code == 200 and "usage_month" not in page.context
    assert client.post(reverse("billing:team_invite"), {"email": "x@example.com"}).status_code == 404
    client.force_login(outsider)
    assert (
        client.post(
            reverse("billing:team_member_update", args=[member.pk]), {"daily_token_cap": "5"}
        ).status_code
        == 404
    )
    assert Membership.objects.get(user=member).daily_token_cap is None


@pytest.mark.django_db
def test_billing_tick_applies_a_downgrade_whose_period_ended(make_user):
    from datetime import timedelta

    from django.utils import timezone

    from billing.management.commands.billing_tick import Command

    owner = make_user("owner")
    team = paying_team(owner)
    sub = Subscription.objects.get(organization=team)
    sub.downgrade_tier = Tier.objects.get(name="free")
    sub.downgrade_at = timezone.now() + timedelta(hours=1)
    sub.save()
    assert Command().tick() == (0, 0)  # not due yet
    owner.refresh_from_db()
    assert owner.tier.name == "paid"
    Subscription.objects.filter(pk=sub.pk).update(downgrade_at=timezone.now() - timedelta(seconds=1))
    assert Command().tick() == (1, 0)
    owner.refresh_from_db()
    assert owner.tier.name == "free"
    assert Subscription.objects.get(pk=sub.pk).downgrade_at is None


@pytest.mark.django_db
def test_staff_see_subscriptions_in_the_admin_and_cannot_edit_them(client, make_user):
    owner = make_user("owner")
    paying_team(owner)
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    listing = client.get("/admin/billing/subscription/")
    assert (
        listing.status_code == 200
        and "sub_acme" in listing.content.decode()
        and "acme" in listing.content.decode()
    )
    sub = Subscription.objects.get()
    assert (
        client.post(f"/admin/billing/subscription/{sub.pk}/change/", {"status": "canceled"}).status_code
        == 403
    )
    assert Subscription.objects.get().status == "active"
    client.force_login(owner)
    assert client.get("/admin/billing/subscription/").status_code == 302  # not staff: to the admin log-in
