"""Team changes that move people between tiers: billing's side of ``organizations/services.py``.

Joining a team that has a subscription puts the new member on the team's tier; leaving it (or being
removed) puts them back on the free tier. Everything else about teams (roles, caps, invitations) is in the
``organizations`` app.
"""

from __future__ import annotations

from django.db import transaction

from billing import stripe_api
from billing.models import FREE_TIER_NAME, Tier
from billing.subscription_models import StripeCustomer
from billing.subscriptions import organization_tier, organization_tier_apply
from organizations import services as org_services
from organizations.models import Membership, Organization
from organizations.selectors import membership_for_user


def team_join(*, token: str, user) -> Membership:
    """Accept invitation ``token`` for ``user`` and move them to the team's tier. Raises
    ``organizations.services.TeamError``."""
    with transaction.atomic():
        membership = org_services.invitation_accept(token=token, user=user)
        organization_tier_apply(organization_id=membership.organization_id)
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
