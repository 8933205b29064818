from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """The operator's pages and commands: ``/healthz``, ``/readyz``, the web ``/metrics``, the staff fleet
    page and ``manage.py fleet``. They read across apps, so they sit at the top beside the API."""

    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"
