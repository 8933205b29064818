"""Safety policies (one per tier, editable in the admin) and the verdict of every moderated message."""

from django.conf import settings
from django.db import models


class SafetyPolicy(models.Model):
    """What the guard chain does for one tier. A tier without a policy row uses the ``SAFETY_DEFAULT_*``
    settings (:func:`safety.policies.policy_for_tier`).

    ``thresholds``: ``{category: score}`` at or above which a category is hit (others use
    ``default_threshold``; a threshold above 1 turns a category off). ``action``: ``block`` (refuse the
    input / cut the reply) or ``flag`` (record and count only). ``flag_only_categories`` are recorded but
    never block. ``on_failure``: ``open`` passes the text when a guard raises or times out, ``closed``
    blocks it. ``input_guards``/``output_guards``: guard names (``rules``, ``profanity``, ``http`` ...)
    from ``SAFETY_GUARDS`` to run on each stage; an empty list runs all of them."""

    class Action(models.TextChoices):
        BLOCK = "block"
        FLAG = "flag"

    class OnFailure(models.TextChoices):
        OPEN = "open", "open (pass the text)"
        CLOSED = "closed", "closed (block the text)"

    tier = models.OneToOneField("billing.Tier", on_delete=models.CASCADE, related_name="safety_policy")
    enabled = models.BooleanField(default=True)
    action = models.CharField(max_length=8, choices=Action.choices, default=Action.BLOCK)
    default_threshold = models.FloatField(default=0.5)
    thresholds = models.JSONField(default=dict, blank=True)
    flag_only_categories = models.JSONField(default=list, blank=True)
    on_failure = models.CharField(max_length=8, choices=OnFailure.choices, default=OnFailure.OPEN)
    guard_timeout_ms = models.PositiveIntegerField(
        default=500, help_text="A guard that runs off-thread (HTTP) and takes longer counts as failed."
    )
    input_guards = models.JSONField(default=list, blank=True)
    output_guards = models.JSONField(default=list, blank=True)
    moderate_output = models.BooleanField(default=True)

    class Meta:
        verbose_name_plural = "safety policies"

    def __str__(self) -> str:
        return f"safety policy of {self.tier}"


class ModerationVerdict(models.Model):
    """The chain's verdict on one checked message: a user's message before admission (``input``) or a
    reply's final text (``output``, also written when a reply is cut mid-stream).

    ``results``: one dict per guard that ran, ``{"guard", "version", "scores": {category: score}, "ms",
    "error"}`` (``error`` "" or the failure kind: ``exception``/``timeout``). ``categories``: the categories
    that were hit. ``guard``: the first guard that hit (or failed closed), for the admin's filters."""

    class Stage(models.TextChoices):
        INPUT = "input"
        OUTPUT = "output"

    class Outcome(models.TextChoices):
        ALLOW = "allow"
        FLAG = "flag"
        BLOCK = "block"

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.CASCADE, related_name="moderation_verdicts"
    )
    # Kept when an unstored API completion's conversation is deleted (the verdict stays for statistics).
    message = models.ForeignKey(
        "conversations.Message",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="moderation_verdicts",
    )
    tier = models.CharField(max_length=32, blank=True, default="")
    stage = models.CharField(max_length=8, choices=Stage.choices)
    action = models.CharField(max_length=8, choices=Outcome.choices)
    guard = models.CharField(max_length=64, blank=True, default="")
    categories = models.JSONField(default=list, blank=True)
    results = models.JSONField(default=list, blank=True)
    failures = models.PositiveSmallIntegerField(default=0)
    # The text judged, kept for staff only when it was flagged or blocked (a blocked reply's text is not
    # stored in its message, so the user, the history API, search and exports never show it). "" otherwise.
    text = models.TextField(blank=True, default="")
    # Staff review (the admin's queue).
    false_positive = models.BooleanField(default=False)
    reviewed_at = models.DateTimeField(null=True, blank=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # What the strike policy did after this verdict ("suspended", "tier:<name>"), "" when nothing.
    strike_outcome = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The review queue: flagged and blocked verdicts, newest first.
            models.Index(
                fields=["-created_at"],
                name="verdict_review_idx",
                condition=models.Q(action__in=["flag", "block"]),
            ),
            # The strike policy counts one user's blocks in a window.
            models.Index(fields=["user", "action", "created_at"], name="verdict_user_action_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.stage} {self.action} #{self.pk}"
