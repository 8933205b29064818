"""What memory stores. Writes go through ``services.py``, reads through ``selectors.py``.

A :class:`Chunk` is a piece of text a user owns, with its embedding. Its owner in the product is named
twice: generically (``source_kind`` + ``source_id``: a reply's turn, an uploaded document, ...) and, where
that owner lives in a conversation, by foreign keys to the conversation and message, so PostgreSQL's
cascades delete the chunks (and, with pgvector, their index rows) when those are deleted. Owners of other
kinds delete theirs with ``services.chunks_delete_for_source`` in their own delete service.
"""

from django.conf import settings
from django.db import models


class Chunk(models.Model):
    """A piece of a user's text and its vector. ``embedding``: the L2-normalised vector as little-endian
    float16 bytes (384 dimensions -> 768 bytes), None until the embeddings worker has embedded it."""

    class Source(models.TextChoices):
        TURN = "turn"  # a user message and the reply to it (source_id: the reply's Message pk)
        DOCUMENT = "document"  # an uploaded file (source_id: the document's pk)

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    source_kind = models.CharField(max_length=16, choices=Source.choices)
    source_id = models.PositiveBigIntegerField()
    # Position of this chunk within its source (0, 1, ...): the order a document's passages are shown in.
    ordinal = models.PositiveIntegerField(default=0)
    conversation = models.ForeignKey(
        "conversations.Conversation", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    message = models.ForeignKey(
        "conversations.Message", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    text = models.TextField()
    # Character offsets of ``text`` in its source's full text, and its length in embedding-model tokens.
    char_start = models.PositiveIntegerField(default=0)
    char_end = models.PositiveIntegerField(default=0)
    token_count = models.PositiveIntegerField(default=0)
    # Free-form facts about where the text came from, for a citation (e.g. {"page": 3}).
    meta = models.JSONField(default=dict, blank=True)
    embedding = models.BinaryField(null=True, blank=True)
    embedding_model = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # The exact-scan store reads one user's embedded rows; index size is counted per user.
            models.Index(fields=["user", "source_kind"], name="memchunk_user_kind_idx"),
            models.Index(fields=["source_kind", "source_id", "ordinal"], name="memchunk_source_idx"),
            # The exact store's check of a user's cached vectors (count, max and sum of ids), index-only.
            models.Index(
                fields=["user", "id"],
                name="memchunk_user_embedded_idx",
                condition=models.Q(embedding__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source_kind} {self.source_id}#{self.ordinal}"


class Recall(models.Model):
    """One chunk recalled into the context of one reply: what the page shows as "recalled from ..."."""

    reply = models.ForeignKey("conversations.Message", on_delete=models.CASCADE, related_name="+")
    chunk = models.ForeignKey(Chunk, on_delete=models.CASCADE, related_name="recalls")
    score = models.FloatField()  # cosine similarity to the question, in [-1, 1]
    rank = models.PositiveSmallIntegerField()

    class Meta:
        ordering = ["reply", "rank"]
        constraints = [models.UniqueConstraint(fields=["reply", "chunk"], name="memrecall_reply_chunk_uniq")]

    def __str__(self) -> str:
        return f"chunk {self.chunk_id} in reply {self.reply_id}"


class Memory(models.Model):
    """An explicit key fact ("remember that ..."): shown and editable in the profile, injected into every
    context of its user within the tier's budget, newest first."""

    MAX_CHARS = 500

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    text = models.CharField(max_length=MAX_CHARS)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        verbose_name_plural = "memories"

    def __str__(self) -> str:
        return self.text[:60]


class AccountMemory(models.Model):
    """A user's memory switch. No row means on (the default)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    enabled = models.BooleanField(default=True)

    def __str__(self) -> str:
        return f"memory {'on' if self.enabled else 'off'} for user {self.user_id}"


class ConversationMemory(models.Model):
    """One conversation's memory switch. No row means on. Off: its turns are not indexed (those already
    indexed are deleted) and nothing is recalled into its replies."""

    conversation = models.OneToOneField(
        "conversations.Conversation", on_delete=models.CASCADE, related_name="+"
    )
    enabled = models.BooleanField(default=True)

    def __str__(self) -> str:
        return f"memory {'on' if self.enabled else 'off'} for conversation {self.conversation_id}"
