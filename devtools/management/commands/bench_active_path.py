"""``manage.py bench_active_path``: how long the active branch of a long conversation takes to load.

Builds a throwaway conversation of ``--messages`` messages (a linear chain with a regenerated sibling every
10th reply), times :func:`conversations.branches.active_path` for the whole branch and for the first page
(what the chat page loads), prints median [min-max] over ``--rounds`` and the query plan, then rolls
everything back.
"""

import statistics
import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import connection, transaction

from conversations import branches
from conversations.models import Conversation, Message


class _Rollback(Exception):
    pass


class Command(BaseCommand):
    help = "Time loading the active branch of a long conversation (one recursive query)."

    def add_arguments(self, parser):
        parser.add_argument("--messages", type=int, default=10_000)
        parser.add_argument("--rounds", type=int, default=20)

    def handle(self, *args, messages: int, rounds: int, **options):
        try:
            with transaction.atomic():
                conversation = self._build(messages)
                self._measure(conversation, rounds)
                raise _Rollback
        except _Rollback:
            pass

    def _build(self, n: int) -> Conversation:
        user = get_user_model().objects.create_user(username="bench-active-path", password=None)
        conversation = Conversation.objects.create(owner=user, title="bench")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT nextval(pg_get_serial_sequence('conversations_message', 'id')) FROM generate_series(1, %s)",
                [n + n // 10],
            )
            ids = [r[0] for r in cursor.fetchall()]
        rows, extra = [], iter(ids[n:])
        for i in range(n):
            role = "user" if i % 2 == 0 else "assistant"
            parent = ids[i - 1] if i else None
            rows.append(
                Message(id=ids[i], conversation=conversation, parent_id=parent, role=role, content=f"m{i}")
            )
            if role == "assistant" and i % 20 == 1:  # an older sibling reply, as Regenerate leaves
                rows.append(
                    Message(
                        id=next(extra), conversation=conversation, parent_id=parent, role=role, content="old"
                    )
                )
        Message.objects.bulk_create(rows, batch_size=2000)
        Message.objects.bulk_update(
            [Message(id=ids[i], active_child_id=ids[i + 1]) for i in range(n - 1)],
            ["active_child"],
            batch_size=2000,
        )
        Conversation.objects.filter(pk=conversation.pk).update(active_leaf_id=ids[n - 1])
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE conversations_message")
        conversation.refresh_from_db()
        self.stdout.write(f"conversation of {len(rows)} messages ({n} on the active branch)")
        return conversation

    def _time(self, fn, rounds: int) -> str:
        fn()  # warm
        samples = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1000)
        return f"{statistics.median(samples):.1f} ms [{min(samples):.1f}-{max(samples):.1f}] over {rounds} rounds"

    def _measure(self, conversation: Conversation, rounds: int) -> None:
        full = self._time(lambda: branches.active_path(conversation=conversation), rounds)
        page = self._time(
            lambda: branches.active_path(conversation=conversation, limit=branches.PATH_PAGE_SIZE), rounds
        )
        params = {"start": conversation.active_leaf_id, "conv": conversation.pk, "limit": 2**31 - 1}

        def sql_only():
            with connection.cursor() as cursor:
                cursor.execute(branches._PATH_SQL, params)
                cursor.fetchall()

        sql = self._time(sql_only, rounds)
        count = len(branches.active_path(conversation=conversation).messages)
        self.stdout.write(f"active path, whole branch, SQL only (rows fetched, no model objects): {sql}")
        self.stdout.write(f"active path, whole branch ({count} messages, with siblings): {full}")
        self.stdout.write(f"active path, first page ({branches.PATH_PAGE_SIZE} messages): {page}")
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + branches._PATH_SQL, params)
            plan = "\n".join(r[0] for r in cursor.fetchall())
        used = sorted({w.strip(",") for w in plan.split() if w.endswith("_idx") or w.endswith("_pkey")})
        self.stdout.write(f"indexes in the plan: {', '.join(used)}")
