"""Writes to teams: create an organisation, invite, accept, remove, set a member's cap.

Every function checks who acts: owners manage, anyone signed in may create a team or accept an invitation
addressed to their e-mail. Errors are :class:`TeamError` with a message meant for the user; nothing is
stored when one is raised. Moving members between tiers is billing's part (``billing/teams.py``).
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from organizations.models import Invitation, Membership, Organization, Role

#: How long an invitation link stays valid.
INVITATION_TTL = timedelta(days=14)


class TeamError(Exception):
    """A team change that is not allowed or not possible; the message is meant for the user."""


def _owner_membership(*, organization: Organization, user) -> Membership:
    membership = Membership.objects.filter(organization=organization, user=user).first()
    if membership is None or not membership.is_owner:
        raise TeamError("Only an owner of the team can do that.")
    return membership


def organization_create(*, name: str, owner) -> Organization:
    """A new organisation with ``owner`` as its first owner. Raises TeamError when ``owner`` already
    belongs to one (a user is in at most one team) or the name is blank."""
    name = name.strip()[:100]
    if not name:
        raise TeamError("Give the team a name.")
    try:
        with transaction.atomic():
            organization = Organization.objects.create(name=name)
            Membership.objects.create(organization=organization, user=owner, role=Role.OWNER)
    except IntegrityError as exc:
        raise TeamError("You already belong to a team.") from exc
    return organization


def invitation_create(
    *, organization: Organization, email: str, invited_by, role: str = Role.MEMBER
) -> Invitation:
    """An invitation for ``email`` (by an owner of ``organization``); its ``token`` goes in the link."""
    _owner_membership(organization=organization, user=invited_by)
    email = email.strip().lower()
    if "@" not in email:
        raise TeamError("Enter an e-mail address.")
    if role not in Role.values:
        raise TeamError("Unknown role.")
    return Invitation.objects.create(
        organization=organization,
        email=email,
        role=role,
        token=secrets.token_urlsafe(32),
        invited_by=invited_by,
        expires_at=timezone.now() + INVITATION_TTL,
    )


def invitation_accept(*, token: str, user) -> Membership:
    """``user`` joins the invitation's organisation with its role. Raises TeamError when the link is
    unknown, used, expired, addressed to another e-mail, or ``user`` is already in a team."""
    with transaction.atomic():
        invitation = Invitation.objects.select_for_update().filter(token=token).first()
        if invitation is None or invitation.accepted_at is not None:
            raise TeamError("This invitation is not valid any more.")
        if invitation.expires_at <= timezone.now():
            raise TeamError("This invitation has expired; ask for a new one.")
        if (user.email or "").strip().lower() != invitation.email:
            raise TeamError("This invitation was sent to another e-mail address.")
        if Membership.objects.filter(user=user).exists():
            raise TeamError("You already belong to a team; leave it first.")
        membership = Membership.objects.create(
            organization=invitation.organization, user=user, role=invitation.role
        )
        invitation.accepted_at = timezone.now()
        invitation.accepted_by = user
        invitation.save(update_fields=["accepted_at", "accepted_by"])
    return membership


def membership_remove(*, organization: Organization, user, removed_by) -> None:
    """Remove ``user`` from ``organization``: an owner removes anyone, a member only themselves (leaving).
    The last owner cannot leave while other members remain."""
    with transaction.atomic():
        membership = (
            Membership.objects.select_for_update().filter(organization=organization, user=user).first()
        )
        if membership is None:
            raise TeamError("Not a member of this team.")
        if removed_by.pk != user.pk:
            _owner_membership(organization=organization, user=removed_by)
        owners = Membership.objects.filter(organization=organization, role=Role.OWNER).exclude(
            pk=membership.pk
        )
        others = Membership.objects.filter(organization=organization).exclude(pk=membership.pk)
        if membership.is_owner and not owners.exists() and others.exists():
            raise TeamError("Make another member an owner before the last owner leaves.")
        membership.delete()


def membership_update(
    *, organization: Organization, user, changed_by, role: str | None = None, daily_token_cap: int | None = -1
) -> Membership:
    """An owner changes a member's ``role`` and/or ``daily_token_cap`` (tokens per quota day; None removes
    the cap; -1, the default, leaves it as it is)."""
    _owner_membership(organization=organization, user=changed_by)
    membership = Membership.objects.filter(organization=organization, user=user).first()
    if membership is None:
        raise TeamError("Not a member of this team.")
    fields = []
    if role is not None:
        if role not in Role.values:
            raise TeamError("Unknown role.")
        if membership.is_owner and role != Role.OWNER:
            if (
                not Membership.objects.filter(organization=organization, role=Role.OWNER)
                .exclude(pk=membership.pk)
                .exists()
            ):
                raise TeamError("A team keeps at least one owner.")
        membership.role = role
        fields.append("role")
    if daily_token_cap != -1:
        if daily_token_cap is not None and daily_token_cap < 0:
            raise TeamError("A cap is a number of tokens, 0 or more.")
        membership.daily_token_cap = daily_token_cap
        fields.append("daily_token_cap")
    if fields:
        membership.save(update_fields=fields)
    return membership
