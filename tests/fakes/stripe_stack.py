"""The Stripe fake (tests/fakes/stripe_server.py) as a process, with the prices the tests buy, and the
chatsite environment that points a daphne at it."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import requests
import stripe

from tests.fakes.stack import server_process
from tests.live_stack import free_port

SECRET_KEY = "sk_test_chatsite"
WEBHOOK_SECRET = "whsec_test_chatsite"
#: (price id, amount in cents, interval, usage type)
PRICES = (
    ("price_paid", 2000, "month", "licensed"),
    ("price_paid_yearly", 20000, "year", "licensed"),
    ("price_pro", 5000, "month", "licensed"),
    ("price_tokens", 1, "month", "metered"),
)


@contextlib.contextmanager
def stripe_fake_server(workdir: Path):
    """Yields the fake's base URL, its prices created."""
    port = free_port()
    args = ["-m", "tests.fakes.stripe_server", "--port", str(port)]
    with server_process(args, port=port, log_path=workdir / "stripe.log") as url:
        client = stripe.StripeClient(SECRET_KEY, base_addresses={"api": url})
        product = client.v1.products.create(params={"name": "chatsite"})
        for price, amount, interval, usage in PRICES:
            client.v1.plans.create(
                params={
                    "id": price,
                    "product": product.id,
                    "amount": amount,
                    "currency": "usd",
                    "interval": interval,
                    "usage_type": usage,
                }
            )
        yield url


def stripe_env(fake_url: str, site_url: str) -> dict[str, str]:
    """chatsite's environment for the Stripe provider against the fake."""
    return {
        "BILLING_PAYMENT_PROVIDER": "billing.stripe_provider.StripeProvider",
        "STRIPE_SECRET_KEY": SECRET_KEY,
        "STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "STRIPE_API_BASE": fake_url,
        "SITE_URL": site_url.rstrip("/") + "/",
    }


def webhook_register(fake_url: str, site_url: str) -> None:
    """Have the fake deliver every event, signed with ``WEBHOOK_SECRET``, to chatsite at ``site_url``."""
    requests.post(
        f"{fake_url}/_config/webhooks/chatsite",
        data={"url": f"{site_url}/billing/stripe/webhook/", "secret": WEBHOOK_SECRET},
    ).raise_for_status()


def webhooks_quiet(fake_url: str, *, settle_s: float = 1.5) -> None:
    """Send the fake's later events nowhere and give deliveries already under way ``settle_s`` seconds to
    finish: a test's database flush must not meet a webhook still writing (they would deadlock)."""
    requests.post(
        f"{fake_url}/_config/webhooks/chatsite", data={"url": "http://127.0.0.1:9/", "secret": WEBHOOK_SECRET}
    ).raise_for_status()
    time.sleep(settle_s)
