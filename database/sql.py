"""Fixed SQL for the reads every reply-creating request makes (docs/overhead.md, lever 19).

Django compiles a queryset's SQL afresh on every call, and a ``count()`` or ``aggregate()`` costs the most:
``Query.get_aggregation`` clones the query, resolves its joins and wraps it before compiling. On 2 vCPUs of
an AMD EPYC Zen 3 that is 1.0-1.9 ms of Python per read against 0.4-0.5 ms for the round trip itself. The
send path's four such reads (the conversation's totals, the user's active replies, the team membership, the
place in line) pass their SQL, written once, to :func:`fetch_one` instead. The statements go through
Django's cursor, so they are counted by ``django_assert_num_queries``, traced and logged like the ORM's.
:func:`fetch_instance` does the same for a read of one model row (lever 22), loading it as a queryset would.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from django.db import connection


def fetch_one(sql: str, params: Sequence) -> tuple | None:
    """The first row of ``sql`` run with ``params`` (``%s`` placeholders; a Python list binds as a
    PostgreSQL array, for ``= ANY(%s)``) on the default connection, inside the caller's transaction if
    any; None when it returns no row. Raises what the driver raises (``django.db.DatabaseError``)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def instance_from_row(model, fields: Sequence, values: Iterable):
    """An instance of ``model`` from one row's ``values`` for its concrete ``fields`` (same order), loaded as
    a queryset loads it: each field's database converters (a ``JSONField`` decodes its text, ...), then
    ``Model.from_db`` (saved state, the database alias). Extra values after ``fields`` are left unread."""
    converted = []
    for field, value in zip(fields, values, strict=False):
        for convert in field.get_db_converters(connection):
            value = convert(value, field.cached_col, connection)
        converted.append(value)
    return model.from_db(connection.alias, [f.attname for f in fields], converted)


@functools.cache
def _select_statement(model, where: str, for_update: bool) -> str:
    columns = ", ".join(f'"{f.column}"' for f in model._meta.concrete_fields)
    lock = " FOR UPDATE" if for_update else ""
    return f'SELECT {columns} FROM "{model._meta.db_table}" WHERE {where}{lock}'


def fetch_instance(model, where: str, params: Sequence, *, for_update: bool = False):
    """The first row of ``model``'s table matching ``where`` (a fixed SQL condition with ``%s``
    placeholders, e.g. ``"id = %s AND owner_id = %s"``) loaded as :func:`instance_from_row` loads it, or
    None. ``for_update``: with its row lock (``FOR UPDATE``, held until the caller's transaction ends). The
    statement is built once per ``(model, where, for_update)``; what ``QuerySet.get`` spends compiling its
    SQL on every call (0.5-1.0 ms of Python for a conversation read on 2 vCPUs of an AMD EPYC Zen 3) is not spent. Raises what the
    driver raises."""
    row = fetch_one(_select_statement(model, where, for_update), params)
    return None if row is None else instance_from_row(model, model._meta.concrete_fields, row)
