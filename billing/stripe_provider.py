"""The Stripe payment provider: Checkout for a first subscription, a price change for a team that already
pays, the customer portal for cards, invoices and cancellation.

Chosen with ``BILLING_PAYMENT_PROVIDER=billing.stripe_provider.StripeProvider`` (the manual provider stays
the default). The tier itself changes only when Stripe confirms, through the webhook
(``billing/webhooks.py``), or right after a price change Stripe accepted.
"""

from __future__ import annotations

import stripe
from django.conf import settings
from django.urls import reverse

from billing import stripe_api
from billing.models import FREE_TIER_NAME
from billing.payments import PaymentProvider
from billing.services import UpgradeError
from billing.subscription_models import Plan, Subscription
from billing.subscriptions import ACTIVE, IN_GRACE, price_id_of, subscription_sync, tier_rank
from billing.teams import stripe_customer_ensure, team_for_checkout
from organizations.selectors import members_of
from organizations.services import TeamError


class PaymentError(UpgradeError):
    """A plan change Stripe refused or could not be reached for; the message is meant for the user."""


def site_url(path: str) -> str:
    """``path`` on the public address of the site (``SITE_URL``), for Stripe's redirects back."""
    return settings.SITE_URL.rstrip("/") + path


class StripeProvider(PaymentProvider):
    """Pays for an upgrade request through Stripe: returns the Checkout (or usage page) URL to send the
    user to; raises :class:`PaymentError` (nothing changes) when it cannot."""

    name = "stripe"
    pending_message = "Complete the payment on Stripe's page; your plan changes once it is confirmed."

    def start(self, upgrade_request) -> str | None:
        user = upgrade_request.user
        to_tier = upgrade_request.to_tier
        try:
            organization = team_for_checkout(user=user)
        except TeamError as exc:
            raise PaymentError(str(exc)) from exc
        current = (
            Subscription.objects.filter(organization=organization, status__in=ACTIVE | IN_GRACE)
            .select_related("plan__tier")
            .first()
        )
        try:
            if current is not None:
                return self._change(current, upgrade_request)
            plan = Plan.objects.filter(tier=to_tier, active=True).first()
            if plan is None:
                raise PaymentError("This plan cannot be bought online; ask an administrator.")
            customer_id = stripe_customer_ensure(organization=organization, email=user.email)
            line_items = [
                {
                    "price": plan.stripe_price_id,
                    "quantity": max(1, len(members_of(organization=organization))),
                }
            ]
            if plan.metered_price_id:
                line_items.append({"price": plan.metered_price_id})
            session = stripe_api.checkout_session_create(
                customer_id=customer_id,
                line_items=line_items,
                success_url=site_url(reverse("billing:usage")) + "?checkout=success",
                cancel_url=site_url(reverse("billing:upgrade")) + "?checkout=cancelled",
                reference=str(upgrade_request.pk),
                metadata={
                    "organization_id": str(organization.pk),
                    "upgrade_request_id": str(upgrade_request.pk),
                },
            )
        except stripe.StripeError as exc:
            raise PaymentError("The payment service could not be reached; try again in a minute.") from exc
        upgrade_request.provider_reference = session["id"]
        upgrade_request.save(update_fields=["provider_reference"])
        return session["url"]

    def _change(self, current: Subscription, upgrade_request) -> str:
        """A team that already pays: move its subscription to the plan of the requested tier (free: cancel
        at the period's end). Upgrades apply at once, downgrades at the period's end."""
        to_tier = upgrade_request.to_tier
        if to_tier.name == FREE_TIER_NAME:
            data = stripe_api.subscription_cancel_at_period_end(
                subscription_id=current.stripe_subscription_id
            )
        else:
            plan = Plan.objects.filter(tier=to_tier, active=True).first()
            if plan is None:
                raise PaymentError("This plan cannot be bought online; ask an administrator.")
            licensed = set(Plan.objects.values_list("stripe_price_id", flat=True))
            data = stripe_api.subscription_retrieve(current.stripe_subscription_id)
            item = next((i for i in data["items"]["data"] if price_id_of(i) in licensed), None)
            if item is None:
                raise PaymentError("This subscription cannot be changed here; use the billing portal.")
            upgrade = current.tier is None or tier_rank(to_tier) > tier_rank(current.tier)
            data = stripe_api.subscription_change_price(
                subscription_id=current.stripe_subscription_id,
                item_id=item["id"],
                price_id=plan.stripe_price_id,
                upgrade=upgrade,
            )
        subscription_sync(data=data)
        upgrade_request.status = upgrade_request.Status.APPROVED
        upgrade_request.provider_reference = current.stripe_subscription_id
        upgrade_request.save(update_fields=["status", "provider_reference"])
        return reverse("billing:usage") + "?plan=changed"


def portal_url(*, organization) -> str:
    """The customer portal for ``organization`` (its owner manages cards, invoices, cancellation there).
    Raises :class:`PaymentError` when the team has no Stripe customer yet or Stripe cannot be reached."""
    customer = getattr(organization, "stripe_customer", None)
    if customer is None:
        raise PaymentError("Your team has no subscription yet.")
    try:
        return stripe_api.portal_session_create(
            customer_id=customer.customer_id, return_url=site_url(reverse("billing:usage"))
        )
    except stripe.StripeError as exc:
        raise PaymentError("The payment service could not be reached; try again in a minute.") from exc
