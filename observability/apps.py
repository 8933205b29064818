from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Metrics, tracing and structured logs. Imports no other app of the product."""

    name = "observability"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from observability import tracing

        tracing.setup_tracing()
