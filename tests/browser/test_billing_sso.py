"""In Chromium: buying the paid plan through Stripe Checkout (the Stripe fake's payment page, webhooks
back to chatsite) and signing in through the loopback OpenID Connect provider. Own daphne (Stripe and SSO
settings), the Stripe fake and the provider as processes; no worker."""

import re

import pytest
from django.conf import settings

from accounts.models import User
from accounts.sessions import session_cookie_for
from billing.models import Tier
from billing.subscription_models import Plan
from tests.fakes.idp import CLIENT_ID, CLIENT_SECRET, PASSWORD, PERSON, identity_provider
from tests.fakes.stack import eventually
from tests.fakes.stripe_stack import stripe_env, stripe_fake_server, webhook_register, webhooks_quiet
from tests.live_stack import daphne_server, free_port

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def site(django_db_setup, tmp_path_factory):
    """``{"url", "stripe"}``: a daphne with the Stripe provider and SSO, the fake and the provider running."""
    work = tmp_path_factory.mktemp("billing-sso")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (
        stripe_fake_server(work) as fake,
        identity_provider(work, [f"{url}/sso/oidc/sso/login/callback/"]) as issuer,
    ):
        env = {
            **stripe_env(fake, url),
            "SSO_OIDC_ISSUER": issuer,
            "SSO_OIDC_CLIENT_ID": CLIENT_ID,
            "SSO_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "SSO_OIDC_NAME": "Corp SSO",
            "SSO_GROUP_TIERS": "engineering=paid",
        }
        with daphne_server(work / "daphne.log", port=port, **env) as served:
            yield {"url": served, "stripe": fake}


@pytest.fixture
def page_at(chromium, site, redis_clean):
    """``page_at(user=None)``: a page in a new context (signed in as ``user``); the fake's webhooks go to the
    site meanwhile and are quiet before the database flush."""
    webhook_register(site["stripe"], site["url"])
    contexts = []

    def make(user=None):
        context = chromium.new_context(base_url=site["url"])
        context.set_default_timeout(30_000)
        contexts.append(context)
        if user is not None:
            name, _, value = session_cookie_for(user).partition("=")
            context.add_cookies([{"name": name, "value": value, "url": site["url"]}])
        return context.new_page()

    yield make
    for context in contexts:
        context.close()
    webhooks_quiet(site["stripe"])


def test_upgrade_through_stripe_checkout(page_at, site, make_user):
    alice = make_user("alice")
    paid = Tier.objects.get(name="paid")
    Plan.objects.create(tier=paid, display_name="Paid", stripe_price_id="price_paid")
    page = page_at(alice)
    page.goto("/billing/upgrade/")
    page.select_option("#upgrade-tier", str(paid.pk))
    page.click("#upgrade-pay")
    page.wait_for_url(re.compile(re.escape(site["stripe"]) + r"/checkout/cs_test_\w+"))
    page.click("#pay")
    page.wait_for_url(re.compile(re.escape(site["url"]) + r"/billing/usage/\?checkout=success"))
    eventually(lambda: User.objects.get(pk=alice.pk).tier_id == paid.pk)
    eventually(lambda: page.reload() or "active" in page.locator("#subscription").inner_text())
    assert "Paid" in page.locator("#subscription").inner_text()
    assert "Your plan: Paid" in page.content()


def test_sign_in_with_sso(page_at, site, make_user):
    make_user("someone")  # the tiers exist
    page = page_at()
    page.goto("/accounts/login/")
    page.click("#sso-login")
    page.wait_for_url(re.compile(r".*/login/\?next=.*"))
    page.fill("#id_username", PERSON)
    page.fill("#id_password", PASSWORD)
    page.click("#idp-submit")
    page.wait_for_url(re.compile(re.escape(site["url"]) + r"/chat/.*"))
    ivy = User.objects.get(username=PERSON)
    assert ivy.tier.name == "paid"  # group "engineering"
    session = next(c for c in page.context.cookies() if c["name"] == settings.SESSION_COOKIE_NAME)
    assert session["value"]
    page.goto("/billing/usage/")
    assert page.url.endswith("/billing/usage/")  # signed in: no redirect to the log-in page
