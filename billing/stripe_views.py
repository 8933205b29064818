"""The Stripe webhook endpoint (public, signature-checked) and the customer portal redirect. Thin: verify,
call ``billing/webhooks.py`` or ``billing/stripe_provider.py``, answer."""

import stripe
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseBadRequest, JsonResponse
from django.shortcuts import redirect
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from billing.stripe_provider import PaymentError, portal_url
from billing.webhooks import InvalidEvent, event_handle, event_parse
from organizations.selectors import membership_for_user


@csrf_exempt
@require_POST
def stripe_webhook(request):
    """POST from Stripe. 400 for a missing, forged or stale signature or a body that is not an event;
    200 ``{"outcome": "handled"|"duplicate"|"ignored"}`` otherwise; 500 when handling failed (Stripe
    retries; nothing was stored)."""
    try:
        event = event_parse(payload=request.body, signature=request.headers.get("Stripe-Signature", ""))
    except stripe.SignatureVerificationError:
        return HttpResponseBadRequest("invalid signature")
    except InvalidEvent:
        return HttpResponseBadRequest("invalid payload")
    return JsonResponse({"outcome": event_handle(event=event)})


@login_required
@require_POST
def billing_portal(request):
    """Send a team owner to Stripe's customer portal (cards, invoices, cancellation)."""
    membership = membership_for_user(user=request.user)
    if membership is None or not membership.is_owner:
        messages.error(request, "Only an owner of a paying team manages its billing.")
        return redirect("billing:usage")
    try:
        return redirect(portal_url(organization=membership.organization))
    except PaymentError as exc:
        messages.error(request, str(exc))
        return redirect("billing:usage")
