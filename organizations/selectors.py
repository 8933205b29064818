"""Reads of teams. One access function per resource: views reach an organisation through
:func:`organization_get_for_member`, which raises when the user is not in it."""

from __future__ import annotations

from django.http import Http404

from organizations.models import Invitation, Membership, Organization


def membership_for_user(*, user) -> Membership | None:
    """The user's membership (with its organisation), or None when the user is in no team."""
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return Membership.objects.select_related("organization").filter(user=user).first()


def organization_get_for_member(*, user, organization_id: int, owner: bool = False) -> Organization:
    """The organisation ``organization_id`` when ``user`` is a member of it (an owner, with ``owner``);
    raises Http404 otherwise, the same answer for "no such team" and "not yours"."""
    membership = membership_for_user(user=user)
    if (
        membership is None
        or membership.organization_id != organization_id
        or (owner and not membership.is_owner)
    ):
        raise Http404("No such team.")
    return membership.organization


def members_of(*, organization: Organization) -> list[Membership]:
    """Memberships of ``organization`` with their users, owners first."""
    return list(
        Membership.objects.filter(organization=organization)
        .select_related("user")
        .order_by("-role", "user__username")
    )


def invitations_open(*, organization: Organization) -> list[Invitation]:
    """Invitations of ``organization`` not accepted yet (expired ones included, marked by ``expires_at``)."""
    return list(Invitation.objects.filter(organization=organization, accepted_at__isnull=True))


def member_user_ids(*, organization_id: int) -> list[int]:
    """Ids of the users in organisation ``organization_id``."""
    return list(Membership.objects.filter(organization_id=organization_id).values_list("user_id", flat=True))
