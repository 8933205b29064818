"""Payment providers: how a plan change is paid for. chatsite never processes cards itself.

A provider gets a freshly stored :class:`~billing.models.UpgradeRequest` and either returns ``None`` (the
request waits for someone to decide it, e.g. an admin) or a URL the user is sent to (a hosted checkout page
of a real provider, whose webhook would later call ``billing.services.upgrade_request_approve``). The
built-in provider is :class:`ManualApprovalProvider`: an admin approves or rejects pending requests in the
Django admin (after arranging payment outside chatsite, e.g. an invoice). Choose one with
``BILLING_PAYMENT_PROVIDER`` (dotted path). The interface follows the "hosted checkout + webhook" shape
of Stripe Checkout / Paddle, so a real provider is a subclass, not a rewrite.
"""

from __future__ import annotations

from django.conf import settings
from django.utils.module_loading import import_string


class PaymentProvider:
    """Interface of a payment provider. ``name`` is stored on each request as ``UpgradeRequest.provider``."""

    name = "abstract"
    #: Sentence shown to the user after the request was filed.
    pending_message = ""

    def start(self, upgrade_request) -> str | None:
        """Begin paying for ``upgrade_request``: a checkout URL to redirect the user to, or None."""
        raise NotImplementedError


class ManualApprovalProvider(PaymentProvider):
    """No online payment: the request stays ``pending`` until an admin approves it (which changes the
    user's tier) or rejects it, in the admin's "Upgrade requests" list."""

    name = "manual"
    pending_message = "Your request was sent. An administrator will review it and contact you about payment."

    def start(self, upgrade_request) -> str | None:
        return None


def payment_provider() -> PaymentProvider:
    """The configured provider (``settings.BILLING_PAYMENT_PROVIDER``), instantiated."""
    return import_string(settings.BILLING_PAYMENT_PROVIDER)()
