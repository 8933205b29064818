from django.apps import AppConfig


class DocumentsConfig(AppConfig):
    name = "documents"
    verbose_name = "Documents"

    def ready(self) -> None:
        from documents import signals  # noqa: F401  (stored files leave with their rows)
