"""Stripe subscriptions end to end: chatsite's daphne, the Stripe fake (localstripe plus the endpoints it
lacks, tests/fakes/stripe_server.py) as a separate process, signed webhooks delivered over HTTP to the
running stack. No worker process is needed: nothing here generates a reply."""

from datetime import timedelta

import pytest
import requests
import stripe

from billing.models import Tier, UpgradeRequest
from billing.quota import quota_status
from billing.subscription_models import Invoice, Plan, PoolDailyQuota, StripeEvent, Subscription
from billing.subscriptions import subscriptions_apply_due
from billing.teams import stripe_customer_ensure
from conversations import load
from organizations.services import organization_create
from tests.fakes.stack import eventually, post_form, signed_in, stripe_event, stripe_signature
from tests.fakes.stripe_stack import (
    SECRET_KEY,
    WEBHOOK_SECRET,
    stripe_env,
    stripe_fake_server,
    webhook_register,
    webhooks_quiet,
)
from tests.live_stack import daphne_server, free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def stripe_fake(tmp_path_factory):
    """The Stripe fake, with prices ``price_paid``, ``price_paid_yearly``, ``price_pro``, ``price_tokens``."""
    with stripe_fake_server(tmp_path_factory.mktemp("stripe")) as url:
        yield url


@pytest.fixture(scope="module")
def stack(stripe_fake, django_db_setup, tmp_path_factory):
    """chatsite's daphne with the Stripe provider, pointed at the fake, whose webhooks it receives."""
    port = free_port()
    env = stripe_env(stripe_fake, f"http://127.0.0.1:{port}")
    with daphne_server(tmp_path_factory.mktemp("daphne") / "daphne.log", port=port, **env) as url:
        yield url


@pytest.fixture(autouse=True)
def webhooks(stack, stripe_fake):
    """The fake's webhooks go to the stack during each test, and are quiet before its database flush."""
    webhook_register(stripe_fake, stack)
    yield
    webhooks_quiet(stripe_fake)


@pytest.fixture
def stripe_settings(settings, stripe_fake):
    """This process calls the fake too (customers, subscriptions the tests set up, metering)."""
    settings.BILLING_PAYMENT_PROVIDER = "billing.stripe_provider.StripeProvider"
    settings.STRIPE_SECRET_KEY = SECRET_KEY
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.STRIPE_API_BASE = stripe_fake
    return stripe.StripeClient(SECRET_KEY, base_addresses={"api": stripe_fake})


@pytest.fixture
def plans(make_user):
    """Plans ``paid`` and ``pro`` (a third, higher tier) on the fake's prices."""
    paid = Tier.objects.get(name="paid")
    pro = Tier.objects.create(
        name="pro",
        display_name="Pro",
        model_name=paid.model_name,
        requests_per_minute=120,
        tokens_per_day=5_000_000,
        max_reply_tokens=4096,
        max_context_tokens=8192,
        queue_priority=20,
    )
    return {
        "paid": Plan.objects.create(tier=paid, display_name="Paid", stripe_price_id="price_paid"),
        "pro": Plan.objects.create(tier=pro, display_name="Pro", stripe_price_id="price_pro"),
    }


def deliver(stack: str, event: bytes, secret: str = WEBHOOK_SECRET, **kwargs) -> requests.Response:
    headers = {
        "Content-Type": "application/json",
        "Stripe-Signature": stripe_signature(event, secret, **kwargs),
    }
    return requests.post(f"{stack}/billing/stripe/webhook/", data=event, headers=headers)


def paying_team(client: stripe.StripeClient, owner, *, card: str = "4242424242424242"):
    """A team of ``owner`` with its Stripe customer (made through chatsite) and a default card."""
    team = organization_create(name=f"{owner.username}'s team", owner=owner)
    customer = stripe_customer_ensure(organization=team, email=owner.email)
    give_card(client, customer, card)
    return team, customer


def give_card(client: stripe.StripeClient, customer: str, number: str) -> None:
    pm = client.v1.payment_methods.create(
        params={"type": "card", "card": {"number": number, "exp_month": 12, "exp_year": 2030, "cvc": "123"}}
    )
    client.v1.payment_methods.attach(pm.id, params={"customer": customer})
    client.v1.customers.update(customer, params={"invoice_settings": {"default_payment_method": pm.id}})


def tier_of(user) -> str:
    user.refresh_from_db()
    return user.tier.name


def test_checkout_then_webhooks_put_the_buyer_on_the_paid_tier_at_once(
    stack, stripe_settings, make_user, plans
):
    alice = make_user("alice")
    web = signed_in(stack, alice)
    started = post_form(web, "/billing/upgrade/", {"tier": plans["paid"].tier_id})
    assert started.status_code == 302
    checkout = started.headers["Location"]
    assert checkout.startswith(stripe_settings._requestor.base_addresses["api"] + "/checkout/cs_test_")
    request = UpgradeRequest.objects.get(user=alice)
    assert (request.status, request.provider, request.provider_reference) == (
        "pending",
        "stripe",
        checkout.rsplit("/", 1)[1],
    )
    assert tier_of(alice) == "free"  # nothing changes before Stripe confirms
    # Leaving that page unpaid and starting again gives a new checkout; the first request is cancelled.
    again = post_form(web, "/billing/upgrade/", {"tier": plans["paid"].tier_id})
    assert again.status_code == 302 and again.headers["Location"] != checkout
    checkout = again.headers["Location"]
    assert UpgradeRequest.objects.get(pk=request.pk).status == "cancelled"
    request = UpgradeRequest.objects.get(user=alice, status="pending")

    paid = requests.post(checkout, data={"card": "4242424242424242"}, allow_redirects=False)
    assert paid.status_code == 303 and paid.headers["Location"] == f"{stack}/billing/usage/?checkout=success"

    eventually(lambda: tier_of(alice) == "paid")
    sub = eventually(
        lambda: Subscription.objects.filter(status="active").select_related("plan", "tier").first()
    )
    assert (sub.plan, sub.tier.name, sub.seats, sub.organization.memberships.get().user) == (
        plans["paid"],
        "paid",
        1,
        alice,
    )
    eventually(lambda: UpgradeRequest.objects.get(pk=request.pk).status == "approved")
    invoice = eventually(lambda: Invoice.objects.filter(organization=sub.organization, status="paid").first())
    assert invoice.amount_paid == 2000
    assert {
        "checkout.session.completed",
        "customer.subscription.created",
        "invoice.payment_succeeded",
    } <= set(StripeEvent.objects.values_list("type", flat=True))
    # Sockets and API keys read the tier through the admission cache, as for an admin's change.
    load.clear_cache()
    assert load.current_tier(alice.pk).name == "paid"
    assert quota_status(user=alice).limit == plans["paid"].tier.tokens_per_day
    page = web.get(f"{stack}/billing/usage/").text
    assert "Subscription of" in page and "active" in page and invoice.stripe_invoice_id in page
    period = f"{sub.current_period_start:%Y-%m-%d} – {sub.current_period_end:%Y-%m-%d}"
    assert period in page and sub.current_period_end > sub.current_period_start


def test_forged_stale_or_missing_signature_gets_400_and_stores_nothing(
    stack, stripe_settings, make_user, plans
):
    body = stripe_event(
        "customer.subscription.deleted", {"id": "sub_forged", "customer": "cus_x", "status": "canceled"}
    )
    assert deliver(stack, body, secret="whsec_someone_else").status_code == 400
    assert requests.post(f"{stack}/billing/stripe/webhook/", data=body).status_code == 400
    stale = deliver(stack, body, timestamp=1_700_000_000)  # signed right, but far outside the tolerance
    assert stale.status_code == 400
    assert not StripeEvent.objects.exists()


def test_a_replayed_event_is_a_no_op(stack, stripe_settings, make_user, plans):
    bob = make_user("bob")
    team, customer = paying_team(stripe_settings, bob)
    sub = stripe_settings.v1.subscriptions.create(
        params={"customer": customer, "items": [{"price": "price_paid"}]}
    ).to_dict()
    event = stripe_event("customer.subscription.updated", sub, event_id="evt_replayed")
    first = deliver(stack, event)
    assert first.json() == {"outcome": "handled"}
    row = Subscription.objects.get(stripe_subscription_id=sub["id"])
    # Cancel in Stripe meanwhile: replaying the old event must not sync again (its id was handled).
    stripe_settings.v1.subscriptions.cancel(sub["id"])
    again = deliver(stack, event)
    assert again.json() == {"outcome": "duplicate"}
    assert StripeEvent.objects.filter(event_id="evt_replayed").count() == 1
    assert Subscription.objects.get(pk=row.pk).updated_at == row.updated_at


def test_updated_before_created_ends_in_stripes_current_state(stack, stripe_settings, make_user, plans):
    carol = make_user("carol")
    team, customer = paying_team(stripe_settings, carol)
    created = stripe_settings.v1.subscriptions.create(
        params={"customer": customer, "items": [{"price": "price_paid"}]}
    ).to_dict()
    item = created["items"]["data"][0]["id"]
    updated = stripe_settings.v1.subscriptions.update(
        created["id"],
        params={"items": [{"id": item, "price": "price_pro"}], "proration_behavior": "create_prorations"},
    ).to_dict()
    assert deliver(
        stack, stripe_event("customer.subscription.updated", updated, created=updated["created"] + 5)
    ).ok
    assert tier_of(carol) == "pro"
    # The older "created" arrives last, its snapshot still on price_paid: the current state stays.
    late = deliver(stack, stripe_event("customer.subscription.created", created, created=created["created"]))
    assert late.json() == {"outcome": "handled"}
    sub = Subscription.objects.get(stripe_subscription_id=created["id"])
    assert (sub.plan, sub.tier.name, sub.status) == (plans["pro"], "pro", "active")
    assert tier_of(carol) == "pro"


def test_failed_payment_keeps_the_plan_through_the_grace_period_then_free(
    stack, stripe_settings, make_user, plans
):
    dave, erin = make_user("dave"), make_user("erin")
    team, customer = paying_team(stripe_settings, dave)
    from organizations.models import Membership

    Membership.objects.create(organization=team, user=erin)
    sub = stripe_settings.v1.subscriptions.create(
        params={"customer": customer, "items": [{"price": "price_paid", "quantity": 2}]}
    )
    eventually(lambda: tier_of(dave) == "paid" and tier_of(erin) == "paid")
    assert quota_status(user=erin).limit == 2 * plans["paid"].tier.tokens_per_day  # two seats share the pool

    give_card(stripe_settings, customer, "4000000000000341")  # attaches, then every charge fails
    # A move to the yearly price bills at once; the charge fails and Stripe marks the subscription past_due.
    # (localstripe bills only when the interval changes, and sends no invoice.payment_failed on this path:
    # the test sends that event, signed, with the invoice as the fake holds it.)
    Plan.objects.create(
        tier=plans["paid"].tier, display_name="Paid yearly", stripe_price_id="price_paid_yearly"
    )
    item = sub["items"]["data"][0]["id"]
    stripe_settings.v1.subscriptions.update(
        sub.id, params={"items": [{"id": item, "price": "price_paid_yearly", "quantity": 2}]}
    )
    [failed] = [
        i.to_dict()
        for i in stripe_settings.v1.invoices.list(params={"customer": customer}).data
        if i.status == "open"
    ]
    assert deliver(stack, stripe_event("invoice.payment_failed", failed)).json() == {"outcome": "handled"}
    row = Subscription.objects.get(stripe_subscription_id=sub.id)
    assert row.status == "past_due" and row.grace_until is not None and row.tier.name == "paid"
    assert Invoice.objects.get(stripe_invoice_id=failed["id"]).status == "open"
    assert (tier_of(dave), tier_of(erin)) == ("paid", "paid")  # in grace

    assert subscriptions_apply_due(now=row.grace_until - timedelta(seconds=1)) == 0
    assert subscriptions_apply_due(now=row.grace_until + timedelta(seconds=1)) == 1
    assert (tier_of(dave), tier_of(erin)) == ("free", "free")
    assert Subscription.objects.get(pk=row.pk).tier is None


def test_upgrade_applies_at_once_and_downgrade_at_the_period_end(stack, stripe_settings, make_user, plans):
    frank = make_user("frank")
    team, customer = paying_team(stripe_settings, frank)
    stripe_settings.v1.subscriptions.create(params={"customer": customer, "items": [{"price": "price_paid"}]})
    eventually(lambda: tier_of(frank) == "paid")
    web = signed_in(stack, frank)

    up = post_form(web, "/billing/upgrade/", {"tier": plans["pro"].tier_id})
    assert up.status_code == 302 and up.headers["Location"].startswith("/billing/usage/")
    assert tier_of(frank) == "pro"

    down = post_form(web, "/billing/upgrade/", {"tier": plans["paid"].tier_id})
    assert down.status_code == 302
    sub = Subscription.objects.get(organization=team)
    assert (sub.plan, sub.tier.name, sub.downgrade_tier.name) == (plans["paid"], "pro", "paid")
    assert sub.downgrade_at == sub.current_period_end
    assert tier_of(frank) == "pro"  # paid for until the period ends
    assert subscriptions_apply_due(now=sub.downgrade_at + timedelta(seconds=1)) == 1
    assert tier_of(frank) == "paid"


def test_customer_portal_sends_an_owner_to_stripe(stack, stripe_settings, make_user, plans):
    gina = make_user("gina")
    paying_team(stripe_settings, gina)
    response = post_form(signed_in(stack, gina), "/billing/usage/", {}, action="/billing/portal/")
    assert response.status_code == 302
    assert response.headers["Location"].startswith(
        stripe_settings._requestor.base_addresses["api"] + "/portal/bps_"
    )


def test_tokens_above_the_included_amount_are_reported_once_as_meter_events(
    stack, stripe_settings, make_user, plans
):
    from billing.metering import overage_report_all
    from billing.quota import quota_day

    hank = make_user("hank")
    metered = plans["paid"]
    metered.included_tokens_per_period = 1000
    metered.meter_event_name = "chatsite_tokens"
    metered.metered_price_id = "price_tokens"
    metered.save()
    team, customer = paying_team(stripe_settings, hank)
    # localstripe holds one item per subscription: the metered price is not on it here (meter events are
    # per customer and meter, so the report does not depend on it).
    stripe_settings.v1.subscriptions.create(params={"customer": customer, "items": [{"price": "price_paid"}]})
    eventually(lambda: tier_of(hank) == "paid")
    PoolDailyQuota.objects.create(organization=team, day=quota_day(), used_tokens=1500)

    def reported():
        events = requests.get(f"{stripe_settings._requestor.base_addresses['api']}/_fake/meter_events").json()
        return [int(e["payload"]["value"]) for e in events if e["payload"]["stripe_customer_id"] == customer]

    assert overage_report_all() == 500
    assert overage_report_all() == 0  # nothing new: nothing sent
    PoolDailyQuota.objects.filter(organization=team).update(used_tokens=1700)
    assert overage_report_all() == 200
    assert reported() == [500, 200]


def test_seats_and_the_pool_follow_the_team_members(stack, stripe_settings, make_user, plans):
    from billing.teams import team_join, team_remove
    from organizations.services import invitation_create

    owner, joiner = make_user("owner"), make_user("joiner")
    team, customer = paying_team(stripe_settings, owner)
    sub = stripe_settings.v1.subscriptions.create(
        params={"customer": customer, "items": [{"price": "price_paid"}]}
    )
    eventually(lambda: tier_of(owner) == "paid")
    per_seat = plans["paid"].tier.tokens_per_day
    assert quota_status(user=owner).limit == per_seat

    team_join(
        token=invitation_create(organization=team, email=joiner.email, invited_by=owner).token, user=joiner
    )
    assert stripe_settings.v1.subscriptions.retrieve(sub.id)["items"]["data"][0]["quantity"] == 2
    assert Subscription.objects.get(stripe_subscription_id=sub.id).seats == 2
    assert (tier_of(joiner), quota_status(user=joiner).limit) == ("paid", 2 * per_seat)

    team_remove(organization=team, user=joiner, removed_by=owner)
    assert stripe_settings.v1.subscriptions.retrieve(sub.id)["items"]["data"][0]["quantity"] == 1
    assert (tier_of(joiner), quota_status(user=owner).limit) == ("free", per_seat)
