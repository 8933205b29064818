"""``manage.py bench_fixed_sql``: the hot path's fixed statements in-process against the configured database,
each run the way it ran before and after docs/overhead-levers.md levers 25-26, the variants alternated call by call:

- the worker's claim (``generation_start``'s statement) and a conversation's totals, through Django's
  client-binding cursor (parsed and planned at every run) and through ``database.sql.prepared_cursor``
  (prepared once per connection, on its generic plan);
- the API key read: the queryset it replaced (``select_related("user__tier").get``), and
  ``api.selectors._active_key`` (one fixed, prepared statement);
- a message read for its user (every ``resume`` frame, every ``stop``, a late joiner's catch-up): the
  queryset it replaced (``select_related("conversation").get``) and ``conversations.selectors.message_get_for_user``
  (one fixed, prepared statement; lever 60).

Everything runs inside one transaction that is rolled back (a throwaway user, key, conversation and queued
reply; the claim's reply is put back to ``queued`` between runs, untimed). Prints median [min-max] over rounds
of each round's p50 (ms, the caller's wall time: Python, the round trip and the server's work). A benchmark,
not a test."""

from __future__ import annotations

import statistics
import time
import uuid

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import connection, transaction
from django.utils import timezone

from api.models import ApiKey
from api.selectors import _active_key, _key_statement
from api.services import api_key_create, hash_key
from conversations.admission import _TOTALS_SQL
from conversations.generation_worker import _claim_statement
from conversations.models import Conversation, Message
from conversations.selectors import message_get_for_user
from database.sql import prepared_cursor
from documents.models import Document


class _Rollback(Exception):
    pass


class Command(BaseCommand):
    help = "Time the claim, the totals, the API key read and a message read as they ran before and after levers 25, 26 and 60."

    def add_arguments(self, parser):
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--calls", type=int, default=200, help="timed calls per round and variant")

    def handle(self, *args, rounds, calls, **options):
        per_round: dict[str, list[float]] = {}
        try:
            with transaction.atomic():
                cases = self._cases()
                for _ in range(rounds):
                    for name, p50 in self._round(cases, calls).items():
                        per_round.setdefault(name, []).append(p50)
                raise _Rollback
        except _Rollback:
            pass
        self.stdout.write(
            f"{rounds} rounds x {calls} calls per variant; load average {open('/proc/loadavg').read()[:14]}"
        )
        self.stdout.write("| statement, variant | p50 ms, median [min-max] over rounds |")
        self.stdout.write("|---|---|")
        for name, values in per_round.items():
            self.stdout.write(
                f"| {name} | {statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}] |"
            )

    def _cases(self) -> dict[str, tuple]:
        """name -> (arrange() -> argument, untimed; call(argument), timed)."""
        user = get_user_model().objects.create_user(
            username=f"bench-fixed-sql-{uuid.uuid4().hex[:8]}", password=uuid.uuid4().hex
        )
        _, raw_key = api_key_create(user=user)
        key_hash = hash_key(raw_key)
        conversation = Conversation.objects.create(owner=user, title="bench")
        question = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="hi")
        reply = Message.objects.create(
            conversation=conversation,
            role=Message.Role.ASSISTANT,
            status=Message.Status.QUEUED,
            parent=question,
        )
        claim_sql, _ = _claim_statement()
        key_sql, _ = _key_statement(settings.MEMORY_ENABLED)
        totals = {
            "conversation": conversation.pk,
            "turn_roles": [Message.Role.USER, Message.Role.ASSISTANT],
            "assistant": Message.Role.ASSISTANT,
            "active": list(Message.ACTIVE_STATUSES),
        }

        def claim_params() -> list:
            Message.objects.filter(pk=reply.pk).update(status=Message.Status.QUEUED)  # back in line, untimed
            return [
                *(Message.Status.STREAMING, timezone.now(), "", ""),
                *(reply.pk, Message.Status.QUEUED, Document.Status.READY),
            ]

        def statement(cursor_factory, sql):
            def call(params):
                with cursor_factory() as cursor:
                    cursor.execute(sql, params)
                    return cursor.fetchone()

            return call

        return {
            "the worker's claim, client-bound (before)": (
                claim_params,
                statement(connection.cursor, claim_sql),
            ),
            "the worker's claim, prepared (after)": (claim_params, statement(prepared_cursor, claim_sql)),
            "a conversation's totals, client-bound (before)": (
                lambda: totals,
                statement(connection.cursor, _TOTALS_SQL),
            ),
            "a conversation's totals, prepared (after)": (
                lambda: totals,
                statement(prepared_cursor, _TOTALS_SQL),
            ),
            "the API key read, the queryset (before)": (lambda: key_hash, _reference_key),
            "the API key read, its fixed SQL client-bound": (
                lambda: {"key_hash": key_hash},
                statement(connection.cursor, key_sql),
            ),
            "the API key read, fixed and prepared (after)": (
                lambda: key_hash,
                lambda key: _active_key(key_hash=key),
            ),
            "a message read for its user, the queryset (before)": (
                lambda: reply.pk,
                lambda pk: _reference_message(user, pk),
            ),
            "a message read for its user, fixed and prepared (after)": (
                lambda: reply.pk,
                lambda pk: message_get_for_user(user=user, message_id=pk),
            ),
        }

    def _round(self, cases, calls: int) -> dict[str, float]:
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for i in range(calls + 20):  # the first 20 of each variant warm up and are not kept
            order = list(cases.items()) if i % 2 == 0 else list(reversed(cases.items()))
            for name, (arrange, call) in order:
                argument = arrange()
                started = time.perf_counter()
                call(argument)
                if i >= 20:
                    samples[name].append((time.perf_counter() - started) * 1e3)
        return {name: statistics.median(values) for name, values in samples.items()}


def _reference_message(user, message_id: int) -> Message:
    """``message_get_for_user``'s read as it was before lever 60."""
    return Message.objects.select_related("conversation").get(pk=message_id, conversation__owner=user)


def _reference_key(key_hash: str):
    """The API key read as it was before lever 26."""
    return ApiKey.objects.select_related("user__tier").get(key_hash=key_hash, revoked_at__isnull=True)
