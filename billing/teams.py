"""Team changes that move people between tiers: billing's side of ``organizations/services.py``.

Joining a team that has a subscription puts the new member on the team's tier; leaving it (or being
removed) puts them back on the free tier; either way the subscription's seats follow the member count.
Everything else about teams (roles, caps, invitations) is in the ``organizations`` app.
"""

from __future__ import annotations

import logging

import stripe
from django.conf import settings
from django.db import transaction

from billing import stripe_api
from billing.models import FREE_TIER_NAME, Tier
from billing.subscription_models import Plan, StripeCustomer, Subscription
from billing.subscriptions import (
    ACTIVE,
    IN_GRACE,
    organization_tier,
    organization_tier_apply,
    price_id_of,
    subscription_sync,
)
from organizations import services as org_services
from organizations.models import Membership, Organization
from organizations.selectors import member_user_ids, membership_for_user

logger = logging.getLogger(__name__)


def team_join(*, token: str, user) -> Membership:
    """Accept invitation ``token`` for ``user`` and move them to the team's tier. Raises
    ``organizations.services.TeamError``."""
    with transaction.atomic():
        membership = org_services.invitation_accept(token=token, user=user)
        organization_tier_apply(organization_id=membership.organization_id)
    seats_follow_members(organization_id=membership.organization_id)
    return membership


def team_remove(*, organization: Organization, user, removed_by) -> None:
    """Remove ``user`` from ``organization`` (or let them leave); a team with a subscription sends them
    back to the free tier. Raises ``organizations.services.TeamError``."""
    with transaction.atomic():
        had_plan = organization_tier(organization_id=organization.pk) is not None
        org_services.membership_remove(organization=organization, user=user, removed_by=removed_by)
        if had_plan:
            user.tier = Tier.objects.get(name=FREE_TIER_NAME)
            user.save(update_fields=["tier"])
    seats_follow_members(organization_id=organization.pk)


def seats_follow_members(*, organization_id: int) -> bool:
    """Set the seats of the team's paying subscription to its member count (prorated by Stripe), so the
    pool (``tokens_per_day * seats``) grows and shrinks with the team. Returns True when Stripe was asked
    to change. A Stripe error is logged, not raised: the membership change stands, and the portal or the
    next change fixes the count."""
    if not settings.STRIPE_SECRET_KEY:
        return False  # Stripe not configured: seats are whatever the subscription says
    sub = Subscription.objects.filter(organization_id=organization_id, status__in=ACTIVE | IN_GRACE).first()
    members = len(member_user_ids(organization_id=organization_id))
    if sub is None or members < 1 or sub.seats == members:
        return False
    try:
        data = stripe_api.subscription_retrieve(sub.stripe_subscription_id)
        prices = set(Plan.objects.values_list("stripe_price_id", flat=True))
        item = next((i for i in data["items"]["data"] if price_id_of(i) in prices), None)
        if item is None:
            return False
        data = stripe_api.subscription_set_quantity(
            subscription_id=sub.stripe_subscription_id, item_id=item["id"], quantity=members
        )
    except stripe.StripeError:
        logger.warning(
            "could not set the seats of %s to %d", sub.stripe_subscription_id, members, exc_info=True
        )
        return False
    subscription_sync(data=data)
    return True


def team_for_checkout(*, user) -> Organization:
    """The team ``user`` buys a plan for: their own (they must own it), or a new team of one named after
    them. Raises ``organizations.services.TeamError`` for a member who is not an owner."""
    membership = membership_for_user(user=user)
    if membership is None:
        return org_services.organization_create(name=user.get_username(), owner=user)
    if not membership.is_owner:
        raise org_services.TeamError("Ask an owner of your team to change the plan.")
    return membership.organization


def stripe_customer_ensure(*, organization: Organization, email: str) -> str:
    """The team's Stripe customer id, created (and remembered) the first time."""
    existing = (
        StripeCustomer.objects.filter(organization=organization).values_list("customer_id", flat=True).first()
    )
    if existing:
        return existing
    customer_id = stripe_api.customer_create(
        organization_id=organization.pk, email=email, name=organization.name
    )
    StripeCustomer.objects.get_or_create(organization=organization, defaults={"customer_id": customer_id})
    return StripeCustomer.objects.get(organization=organization).customer_id
