"""The team page: create a team, invite people, set roles and per-member caps, remove members, and (for
owners) usage per member. Thin: parse, call ``organizations.services`` / ``billing.teams``, redirect."""

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.mail import send_mail
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from billing.selectors import start_of_day
from billing.stripe_provider import site_url
from billing.team_selectors import team_subscription, usage_per_member
from billing.teams import team_join, team_remove
from organizations.models import Invitation, Role
from organizations.selectors import (
    invitations_open,
    members_of,
    membership_for_user,
    organization_get_for_member,
)
from organizations.services import TeamError, invitation_create, membership_update, organization_create


@login_required
def team(request):
    """The user's team (members, plan, invitations; usage per member for owners), or a form to create one."""
    membership = membership_for_user(user=request.user)
    context = {"membership": membership, "roles": Role.choices}
    if membership is not None:
        org = membership.organization
        context.update(
            organization=org,
            subscription=team_subscription(organization_id=org.pk),
            members=members_of(organization=org),
        )
        if membership.is_owner:
            month = start_of_day().replace(day=1)
            context.update(
                usage_today=usage_per_member(organization_id=org.pk, since=start_of_day()),
                usage_month=usage_per_member(organization_id=org.pk, since=month),
                invitations=invitations_open(organization=org),
            )
    return render(request, "billing/team.html", context)


def _done(request, action, *args, success: str = "", **kwargs):
    try:
        result = action(*args, **kwargs)
    except TeamError as exc:
        messages.error(request, str(exc))
        return None
    if success:
        messages.success(request, success)
    return result


@login_required
@require_POST
def team_create(request):
    """POST ``name``: a new team with the user as its owner."""
    _done(
        request,
        organization_create,
        name=request.POST.get("name", ""),
        owner=request.user,
        success="Team created.",
    )
    return redirect("billing:team")


def _member_org(request, *, owner: bool = True):
    membership = membership_for_user(user=request.user)
    return organization_get_for_member(
        user=request.user, organization_id=membership.organization_id if membership else -1, owner=owner
    )


@login_required
@require_POST
def team_invite(request):
    """POST ``email`` and ``role`` (owners): an invitation link, mailed and shown to the owner."""
    org = _member_org(request)
    invitation = _done(
        request,
        invitation_create,
        organization=org,
        email=request.POST.get("email", ""),
        role=request.POST.get("role", Role.MEMBER),
        invited_by=request.user,
    )
    if invitation is not None:
        link = site_url(reverse("billing:team_join", args=[invitation.token]))
        send_mail(
            f"Join {org.name} on chatsite",
            f"{request.user.get_username()} invites you to the team {org.name}: {link}",
            None,
            [invitation.email],
            fail_silently=True,
        )
        messages.success(request, f"Invitation sent to {invitation.email}. Link: {link}")
    return redirect("billing:team")


def _cap(raw: str) -> int | None:
    raw = raw.strip()
    return int(raw) if raw else None


@login_required
@require_POST
def team_member_update(request, user_id: int):
    """POST ``role`` and/or ``daily_token_cap`` (blank: no cap) for member ``user_id`` (owners)."""
    org = _member_org(request)
    member = get_user_model().objects.filter(pk=user_id).first()
    try:
        cap = _cap(request.POST.get("daily_token_cap", "")) if "daily_token_cap" in request.POST else -1
    except ValueError:
        messages.error(request, "A cap is a whole number of tokens.")
        return redirect("billing:team")
    if member is None:
        messages.error(request, "Not a member of this team.")
    else:
        _done(
            request,
            membership_update,
            organization=org,
            user=member,
            changed_by=request.user,
            role=request.POST.get("role") or None,
            daily_token_cap=cap,
            success="Member updated.",
        )
    return redirect("billing:team")


@login_required
@require_POST
def team_member_remove(request, user_id: int):
    """Remove member ``user_id`` (owners), or leave the team (``user_id`` = yourself)."""
    org = _member_org(request, owner=False)
    member = get_user_model().objects.filter(pk=user_id).first()
    if member is not None:
        _done(
            request, team_remove, organization=org, user=member, removed_by=request.user, success="Removed."
        )
    return redirect("billing:team")


@login_required
@require_http_methods(["GET", "POST"])
def team_join_view(request, token: str):
    """GET: the invitation; POST: accept it (the signed-in user's e-mail must be the invited one)."""
    invitation = Invitation.objects.select_related("organization").filter(token=token).first()
    if request.method == "POST":
        if (
            _done(request, team_join, token=token, user=request.user, success="You joined the team.")
            is not None
        ):
            return redirect("billing:team")
    return render(
        request, "billing/team_join.html", {"invitation": invitation}, status=200 if invitation else 404
    )
