from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    """Development tools' management commands: ``loadtest``, ``overload``, ``drills``, ``load_signal_bench``,
    ``bench_active_path``, ``bench_api`` and ``observability_overhead``."""

    name = "devtools"
    default_auto_field = "django.db.models.BigAutoField"
