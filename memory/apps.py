from django.apps import AppConfig


class MemoryConfig(AppConfig):
    """Retrieval over a user's own history: chunks, embeddings, the vector store, recall and key facts."""

    name = "memory"
    default_auto_field = "django.db.models.BigAutoField"
