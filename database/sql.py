"""Fixed SQL for the reads every reply-creating request makes (docs/overhead-levers.md, lever 19).

Django compiles a queryset's SQL afresh on every call, and a ``count()`` or ``aggregate()`` costs the most:
``Query.get_aggregation`` clones the query, resolves its joins and wraps it before compiling. On 2 vCPUs of
an AMD EPYC Zen 3 that is 1.0-1.9 ms of Python per read against 0.4-0.5 ms for the round trip itself. The
send path's four such reads (the conversation's totals, the user's active replies, the team membership, the
place in line) pass their SQL, written once, to :func:`fetch_one` instead. The statements go through
Django's cursor, so they are counted by ``django_assert_num_queries``, traced and logged like the ORM's.
:func:`fetch_instance` does the same for a read of one model row (lever 22), loading it as a queryset would,
and :func:`insert_instance` for an insert of one (lever 27), as ``Model.objects.create`` stores it.

Each of these statements is also parsed and planned by PostgreSQL once per connection, not on every call
(:func:`prepared_cursor`, lever 25): planning the worker's claim took 0.9-3.2 ms of the server's time per
reply and the send's message chain 1.0 ms, several times their execution.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Sequence

from django.db import connection
from django.db.backends.postgresql.base import TIMESTAMPTZ_OID, ServerBindingCursor
from django.db.backends.postgresql.psycopg_any import register_tzloader
from psycopg._queries import PostgresQuery, _query2pg_nocache
from psycopg.pq import Format

#: Runs of one statement on one connection before psycopg prepares it there: 0, at its first run. Every
#: statement through :func:`prepared_cursor` is fixed SQL run on every request, so waiting for psycopg's
#: default (5 runs) only delays the saving; with up to ``DB_POOL_MAX_SIZE`` connections per process it
#: delayed it for hundreds of requests. Preparing costs one round trip of its own, once per connection.
PREPARE_THRESHOLD = 0


#: Fixed statements whose placeholder conversion :class:`_FixedStatementQuery` keeps: far more than the shapes
#: the callers of :func:`prepared_cursor` build (a few dozen), so none is ever converted twice in a process.
CONVERTED_STATEMENTS = 512


@functools.lru_cache(maxsize=CONVERTED_STATEMENTS)
def _converted(query: bytes, encoding: str) -> tuple:
    return _query2pg_nocache(query, encoding)


class _FixedStatementQuery(PostgresQuery):
    """psycopg's conversion of a query's ``%s``/``%(name)s`` placeholders into PostgreSQL's ``$n`` (a scan of
    the whole text), kept per statement for every statement of :func:`prepared_cursor` (docs/overhead-levers.md,
    lever 61). psycopg keeps it only for a statement of at most 50 parameters and 4 KiB
    (``psycopg._queries.MAX_CACHED_STATEMENT_PARAMS``; ORM-built inserts of varying row counts would fill its
    cache), so the send's message chain insert, with more parameters than that, was scanned again on every send:
    0.09 ms of the web process's CPU per send on an AMD EPYC Zen 4. The statements here are written once each
    (a fixed set of shapes), so the cache stays small. Everything but the cached conversion is psycopg's own
    ``convert`` (psycopg 3.3, pinned: the attributes set here are its internals, which
    ``tests/db/test_prepared_statements.py`` exercises); a ``psycopg.sql`` composition, or a query without
    parameters, goes to it unchanged."""

    __slots__ = ()

    def convert(self, query, vars) -> None:
        if vars is None or not isinstance(query, (str, bytes)):
            super().convert(query, vars)
            return
        query = self._ensure_bytes(query)
        self.query, self._want_formats, self._order, self._parts = _converted(query, self._tx.encoding)
        self.dump(vars)


class _PreparingCursor(ServerBindingCursor):
    """Django's server-binding psycopg cursor, which also records the query of a run of a prepared statement:
    psycopg (3.3) sets ``_query``, which Django's ``last_executed_query`` reads for its query log (and so
    ``CaptureQueriesContext``), only when it sends a statement's text, so a prepared run was logged as the
    previous statement's SQL, or as None. Its placeholders are converted once per statement
    (:class:`_FixedStatementQuery`)."""

    _query_cls = _FixedStatementQuery

    def _send_query_prepared(self, name, pgq, *, binary=None):
        self._query = pgq
        super()._send_query_prepared(name, pgq, binary=binary)


@contextlib.contextmanager
def prepared_cursor() -> Iterator:
    """A cursor of the default connection whose statements become server-side prepared statements
    (``PREPARE``/``EXECUTE``) on their first run on each physical connection (:data:`PREPARE_THRESHOLD`), so
    PostgreSQL parses a fixed statement once per connection instead of on every call, and plans it once
    (generic plans: ``chatsite/settings/database.py``).

    The ORM keeps Django's client-side binding (its cursors never prepare): only the fixed SQL of this
    module's callers, written once with ``%s``/``%(name)s`` placeholders, is bound on the server. The cursor
    is Django's wrapper around psycopg's server-binding cursor, so its statements are counted, logged and
    traced as the ORM's, and driver errors arrive as ``django.db`` errors (``IntegrityError``, ...). A
    psycopg connection forgets its prepared statements on ``ROLLBACK`` (``DEALLOCATE ALL``) and prepares
    each again at its next run. The pool here is psycopg's own, in process; a pooler in transaction mode in
    front of PostgreSQL must track prepared statements (PgBouncer 1.21+: ``max_prepared_statements``).

    Sources: psycopg's "Prepared statements" (``Connection.prepare_threshold``); PostgreSQL's ``PREPARE``
    and ``plan_cache_mode``."""
    # What ``connection.cursor()`` does before it creates Django's client-binding cursor.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw = connection.connection
    if raw.prepare_threshold != PREPARE_THRESHOLD:  # Django sets None (never) on every connection
        raw.prepare_threshold = PREPARE_THRESHOLD
    wrap = connection.make_debug_cursor if connection.queries_logged else connection.make_cursor
    with connection.wrap_database_errors:
        psycopg_cursor = _PreparingCursor(raw)
        # As Django's create_cursor: timestamps load in the connection's current time zone.
        if connection.timezone != raw.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT).timezone:
            register_tzloader(connection.timezone, psycopg_cursor)
        cursor = wrap(psycopg_cursor)
    with cursor:
        yield cursor


def fetch_one(sql: str, params: Sequence) -> tuple | None:
    """The first row of ``sql`` run with ``params`` (``%s`` placeholders; a Python list binds as a
    PostgreSQL array, for ``= ANY(%s)``) on the default connection, inside the caller's transaction if
    any, as a prepared statement (:func:`prepared_cursor`); None when it returns no row. Raises what the
    driver raises (``django.db.DatabaseError``)."""
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def fetch_all(sql: str, params: Sequence) -> list[tuple]:
    """Every row of ``sql`` run with ``params``, as :func:`fetch_one` runs it (a prepared statement on the
    default connection, inside the caller's transaction if any). Raises what the driver raises."""
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


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


def select_list(aliased_models: Sequence[tuple[str, type]]) -> tuple[str, tuple[tuple[type, tuple], ...]]:
    """``(columns, row_fields)`` for one statement that reads a row of each model of ``aliased_models``
    (``((table alias, model), ...)``): the select list of their concrete fields' columns, each qualified by
    its alias, in that order, and ``((model, its concrete fields), ...)`` for :func:`instances_from_row`."""
    row_fields = tuple((model, tuple(model._meta.concrete_fields)) for _, model in aliased_models)
    columns = ", ".join(
        f'{alias}."{field.column}"'
        for (alias, _), (_, fields) in zip(aliased_models, row_fields, strict=True)
        for field in fields
    )
    return columns, row_fields


def instances_from_row(row_fields: Sequence[tuple[type, Sequence]], values: Iterable) -> list:
    """One instance per ``(model, fields)`` of ``row_fields`` (from :func:`select_list`) read off ``values``
    in order, each loaded by :func:`instance_from_row`. Pass an iterator to read the columns after them
    yourself."""
    values = iter(values)
    return [instance_from_row(model, fields, values) for model, fields in row_fields]


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


@functools.cache
def insert_fields(model) -> tuple:
    """The fields an insert of a new ``model`` row writes, in order: its concrete fields but the auto primary
    key. Raises ``ValueError`` for a model with a database default (``db_default``), which the ORM's insert
    leaves to the database: save such a model through the ORM."""
    meta = model._meta
    if any(f.has_db_default() for f in meta.local_concrete_fields):
        raise ValueError(f"{meta.label} has a field with a database default: save it through the ORM")
    return tuple(f for f in meta.local_concrete_fields if f is not meta.auto_field)


@functools.cache
def _insert_statement(model) -> tuple[str, tuple]:
    meta = model._meta
    fields = insert_fields(model)
    columns = ", ".join(f'"{f.column}"' for f in fields)
    placeholders = ", ".join(["%s"] * len(fields))
    returning = f' RETURNING "{meta.auto_field.column}"' if meta.auto_field is not None else ""
    return f'INSERT INTO "{meta.db_table}" ({columns}) VALUES ({placeholders}){returning}', fields


def insert_instance(instance):
    """Store a new, unsaved ``instance`` as ``Model.objects.create`` would (each field's ``pre_save`` for an
    insert: defaults, ``auto_now_add``; then its ``get_db_prep_save``; the auto primary key read back onto the
    instance, which then counts as saved), in one fixed statement built once per model and prepared
    (:func:`prepared_cursor`). What the ORM's insert spends building its SQL on every call (0.6 ms of Python
    per row on 2 vCPUs of an AMD EPYC Zen 3, docs/overhead-levers.md lever 27) is not spent. No ``pre_save`` or
    ``post_save`` signal is sent: use it only for models without receivers. Returns ``instance``. Raises
    ``ValueError`` for a model with a database default (``db_default``), and what the driver raises
    (``IntegrityError`` for a unique value taken, as ``create`` does)."""
    model = type(instance)
    sql, fields = _insert_statement(model)
    params = insert_values(instance, fields)
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone() if model._meta.auto_field is not None else None
    return mark_saved(instance, pk=None if row is None else row[0])


def insert_values(instance, fields) -> list:
    """The values an insert of the new, unsaved ``instance`` binds for ``fields`` (in that order), as the ORM's
    insert computes them: each field's ``pre_save`` for an insert (defaults, ``auto_now_add``, which it also
    sets on ``instance``), then its ``get_db_prep_save`` for this connection."""
    return [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]


def mark_saved(instance, *, pk=None):
    """Mark ``instance``, just stored by fixed SQL, as saved in the default database, as the ORM's save does
    (its primary key set to ``pk`` when given). Returns ``instance``."""
    if pk is not None:
        setattr(instance, instance._meta.pk.attname, pk)
    instance._state.adding = False
    instance._state.db = connection.alias
    return instance
