"""Conversations and their messages. Writes go through ``services.py``, reads through ``selectors.py``."""

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector
from django.db import models


class Conversation(models.Model):
    """A chat thread owned by one user. ``system_prompt`` is pinned at the head of every model context."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, blank=True, default="")
    system_prompt = models.TextField(blank=True, default="")
    # The model the user picked on the page for this conversation's replies (one of the tier's models,
    # ``inference.registry.models_for_tier``); "" follows the tier's routing (its own model, degraded to the
    # lighter one under load). A choice the tier no longer offers is treated as "".
    model_name = models.CharField(max_length=100, blank=True, default="")
    # The newest message of the branch on screen; the active path is its chain of parents (one recursive
    # query, see selectors.active_path). Null only for a conversation without messages.
    active_leaf = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # False for an API completion sent without ``store: true``: hidden from history (selectors exclude it)
    # and deleted once its reply ends; its UsageRecord stays.
    stored = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # The idempotency key of the ``send`` that created this conversation (see ``Message.client_id``), so a
    # resent first message finds its conversation instead of starting a second one.
    client_id = models.UUIDField(null=True, blank=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        indexes = [
            # The sidebar pages through one user's conversations, newest first.
            models.Index(fields=["owner", "-updated_at", "-id"], name="conv_owner_updated_idx"),
            # Title search (PostgreSQL full-text search).
            GinIndex(SearchVector("title", config="simple"), name="conv_title_search_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "client_id"],
                condition=models.Q(client_id__isnull=False),
                name="conv_owner_client_id_uniq",
            )
        ]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"


class Message(models.Model):
    """One turn. Assistant messages move ``queued -> streaming -> completed | cancelled | failed | interrupted |
    blocked``; a user message is ``completed``, or ``blocked`` when the content policy refused it;
    their text is written once, when the generation ends. Durations in milliseconds."""

    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"

    class Status(models.TextChoices):
        QUEUED = "queued"
        STREAMING = "streaming"
        COMPLETED = "completed"
        CANCELLED = "cancelled"
        FAILED = "failed"
        INTERRUPTED = "interrupted"
        # The content policy (safety/) refused it: a user's message that got no reply (its text kept and
        # shown to its author), or a reply cut while streaming (stored without text; staff read it in the
        # review queue).
        BLOCKED = "blocked"

    ACTIVE_STATUSES = (Status.QUEUED, Status.STREAMING)
    #: The same statuses as SQL text, for fixed statements that count active or queued replies: written into
    #: the statement, not bound, so that its generic plan (prepared statements, docs/overhead-levers.md lever 25) can
    #: use the partial index ``msg_active_status_idx``; a bound status hides that it is one of these, and the
    #: count scanned every message of the table (lever 29).
    ACTIVE_STATUSES_SQL = "(" + ", ".join(f"'{status}'" for status in ACTIVE_STATUSES) + ")"

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    # The branch tree: a message answers (or follows) its parent; siblings are alternative branches
    # (an edited user message, a regenerated reply). ``active_child`` remembers which branch below this
    # message was shown last, so flipping back to it restores the whole sub-branch.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    active_child = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETED)
    model_name = models.CharField(max_length=100, blank=True, default="")
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    finish_reason = models.CharField(max_length=16, blank=True, default="")
    error = models.TextField(blank=True, default="")
    # How many earlier messages the token-counted sliding window left out of this reply's context.
    omitted_messages = models.PositiveIntegerField(default=0)
    # Observability (issue 11): the model version that generated the reply, and its OpenTelemetry trace id.
    model_version = models.CharField(max_length=64, blank=True, default="")
    trace_id = models.CharField(max_length=32, blank=True, default="")
    # Per-request sampling from the API (``temperature``, ``top_p``, ``stop``, ``seed``, ``max_tokens``,
    # ``presence_penalty``, ``frequency_penalty``); None = the chat defaults from settings.
    sampling = models.JSONField(null=True, blank=True)
    # An API completion's ``user`` (the client's identifier for its end user) and ``metadata`` (up to 16
    # string pairs), stored with the reply as OpenAI stores them with a completion; "" / None otherwise.
    api_user = models.CharField(max_length=256, blank=True, default="")
    api_metadata = models.JSONField(null=True, blank=True)
    # A user message's idempotency key: the UUID the page chose for its ``send`` frame. A resend with the
    # same key answers with the stored ticket instead of storing a second message and reply.
    client_id = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            # A long conversation is paged through in order.
            models.Index(fields=["conversation", "created_at", "id"], name="msg_conv_created_idx"),
            # Siblings of a message (same parent; roots have none) are listed with the active path.
            models.Index(fields=["conversation", "parent"], name="msg_conv_parent_idx"),
            # Message text search (PostgreSQL full-text search, "simple" configuration: no stemming
            # surprises across languages).
            GinIndex(SearchVector("content", config="simple"), name="msg_content_search_idx"),
            # Admission control and the interrupted-message reaper look up active generations.
            models.Index(
                fields=["status"],
                name="msg_active_status_idx",
                condition=models.Q(status__in=["queued", "streaming"]),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["conversation", "client_id"],
                condition=models.Q(client_id__isnull=False),
                name="msg_conv_client_id_uniq",
            )
        ]

    def __str__(self) -> str:
        return f"{self.role} #{self.pk} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE_STATUSES


class SharedLink(models.Model):
    """A read-only snapshot of a conversation's active branch, viewable without an account at
    ``/s/<token>/`` until its owner revokes it. ``snapshot`` is frozen at creation: a list of
    ``{"role", "content", "created_at"}`` dicts, so later messages never appear."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="shared_links")
    # secrets.token_urlsafe(24): 192 random bits, unguessable.
    token = models.CharField(max_length=64, unique=True)
    title = models.CharField(max_length=200, blank=True, default="")
    snapshot = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"share of {self.conversation_id} ({'revoked' if self.revoked_at else 'live'})"
