"""Files uploaded to a conversation and the chunks of their text. Writes go through ``services.py``,
reads through ``selectors.py``. Conversations and messages are referenced by string so this app never
imports the conversations app (it sits below it)."""

from django.conf import settings
from django.db import models

from documents.storage import document_path, document_storage


class Document(models.Model):
    """One uploaded file. ``status`` moves ``processing -> ready | failed``; while processing, ``stage``
    (``queued``, ``extracting``, ``embedding``) and ``progress_done``/``progress_total`` (pages, then
    chunks) say how far it got. A failed file keeps its row (the page shows ``error``) but neither its
    stored bytes nor any chunk."""

    class Kind(models.TextChoices):
        PDF = "pdf", "PDF"
        DOCX = "docx", "Word document"
        TEXT = "text", "Text"
        MARKDOWN = "markdown", "Markdown"

    class Status(models.TextChoices):
        PROCESSING = "processing"
        READY = "ready"
        FAILED = "failed"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="documents")
    conversation = models.ForeignKey(
        "conversations.Conversation", on_delete=models.CASCADE, related_name="documents"
    )
    name = models.CharField(max_length=255)  # as uploaded; shown, never used as a path
    kind = models.CharField(max_length=16, choices=Kind.choices)
    content_type = models.CharField(max_length=100)
    size_bytes = models.PositiveBigIntegerField()
    pages = models.PositiveIntegerField(null=True, blank=True)  # PDFs only
    sha256 = models.CharField(max_length=64)
    file = models.FileField(storage=document_storage, upload_to=document_path, max_length=255, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PROCESSING)
    stage = models.CharField(max_length=16, blank=True, default="queued")
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    chunk_count = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    # Seconds from the start of processing to ready (parse + chunk + embed + write).
    process_ms = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["conversation", "created_at"], name="doc_conv_created_idx")]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class Citation(models.Model):
    """A passage (a memory chunk of a document) given to the model for one reply, as ``[marker]`` in its
    context; the page shows it as a chip that opens the passage. Deleting the file (its chunks) or the reply
    deletes its citations."""

    message = models.ForeignKey("conversations.Message", on_delete=models.CASCADE, related_name="citations")
    chunk = models.ForeignKey("memory.Chunk", on_delete=models.CASCADE, related_name="citations")
    marker = models.PositiveSmallIntegerField()
    score = models.FloatField()  # cosine similarity to the question

    class Meta:
        ordering = ["message_id", "marker"]
        constraints = [models.UniqueConstraint(fields=["message", "marker"], name="citation_msg_marker_uniq")]

    def __str__(self) -> str:
        return f"[{self.marker}] of message {self.message_id}"
