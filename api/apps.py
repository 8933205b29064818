from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The OpenAI-compatible ``/v1`` API, API keys and the history JSON API (``/api``)."""

    name = "api"
    default_auto_field = "django.db.models.BigAutoField"
