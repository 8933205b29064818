from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Metrics, tracing, structured logs, health checks and fleet operations."""

    name = "observability"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from observability import tracing

        tracing.setup_tracing()
