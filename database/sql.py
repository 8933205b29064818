"""Fixed SQL for the reads every reply-creating request makes (docs/overhead.md, lever 19).

Django compiles a queryset's SQL afresh on every call, and a ``count()`` or ``aggregate()`` costs the most:
``Query.get_aggregation`` clones the query, resolves its joins and wraps it before compiling. On 2 vCPUs of
an AMD EPYC Zen 3 that is 1.0-1.9 ms of Python per read against 0.4-0.5 ms for the round trip itself. The
send path's four such reads (the conversation's totals, the user's active replies, the team membership, the
place in line) pass their SQL, written once, to :func:`fetch_one` instead. The statements go through
Django's cursor, so they are counted by ``django_assert_num_queries``, traced and logged like the ORM's.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection


def fetch_one(sql: str, params: Sequence) -> tuple | None:
    """The first row of ``sql`` run with ``params`` (``%s`` placeholders; a Python list binds as a
    PostgreSQL array, for ``= ANY(%s)``) on the default connection, inside the caller's transaction if
    any; None when it returns no row. Raises what the driver raises (``django.db.DatabaseError``)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()
