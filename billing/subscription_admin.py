"""Admin for paid plans: plans on sale, each team's subscriptions (read-only: Stripe is the source of
truth, changed through the customer portal or Stripe's dashboard), invoices and handled webhook events."""

from django.contrib import admin

from billing.subscription_models import Invoice, Plan, StripeCustomer, StripeEvent, Subscription


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = (
        "display_name",
        "tier",
        "stripe_price_id",
        "included_tokens_per_period",
        "meter_event_name",
        "active",
    )
    list_filter = ("active", "tier")
    list_editable = ("active",)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    list_display = (
        "organization",
        "plan",
        "status",
        "tier",
        "seats",
        "current_period_end",
        "cancel_at_period_end",
        "downgrade_at",
        "grace_until",
        "stripe_subscription_id",
    )
    list_filter = ("status", "tier", "plan", "cancel_at_period_end")
    search_fields = ("organization__name", "stripe_subscription_id", "stripe_customer_id")
    list_select_related = ("organization", "plan", "tier")


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyAdmin):
    list_display = ("created", "organization", "number", "status", "amount_due", "amount_paid", "currency")
    list_filter = ("status",)
    search_fields = ("organization__name", "stripe_invoice_id", "number")


@admin.register(StripeCustomer)
class StripeCustomerAdmin(ReadOnlyAdmin):
    list_display = ("organization", "customer_id", "created_at")
    search_fields = ("organization__name", "customer_id")


@admin.register(StripeEvent)
class StripeEventAdmin(ReadOnlyAdmin):
    list_display = ("received_at", "type", "event_id", "created")
    list_filter = ("type",)
    search_fields = ("event_id",)
