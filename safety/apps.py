from django.apps import AppConfig


class SafetyConfig(AppConfig):
    """The guardrail layer: input and output moderation around every reply (issue 26)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "safety"
    verbose_name = "Safety"
