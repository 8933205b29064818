"""How every process (web, GPU and embeddings workers) connects to PostgreSQL, read from the environment.

``CONN_MAX_AGE`` 0: daphne runs sync views in per-request threads, so a persistent connection would be left
open per request (Django's ASGI docs: disable persistent connections under ASGI; Django ticket #33497), and
each database call closes its connection (``database/connections.py``). With psycopg's pool (Django 5.1+,
``OPTIONS["pool"]``) closing returns it instead of costing a new PostgreSQL connection (socket,
authentication, a backend process) per call. Figures: ``docs/overhead.md``.

Every connection starts with ``plan_cache_mode=force_generic_plan``. It applies only to prepared statements,
which here are the fixed SQL run through ``database/sql.py: prepared_cursor`` (the ORM binds on the client
and never prepares), so PostgreSQL plans each of those once per connection instead of at every run
(docs/overhead-levers.md, lever 25): under its default (``auto``) the worker's claim was planned afresh at every
run, about 1 ms of the server's time per reply.
"""

#: libpq's ``options``: server settings every connection starts with (see the module docstring).
SESSION_OPTIONS = "-c plan_cache_mode=force_generic_plan"


def database_settings(env, options: dict) -> dict:
    """``ENGINE``, ``CONN_MAX_AGE``, ``CONN_HEALTH_CHECKS`` and ``OPTIONS`` (``options``, from ``DATABASE_URL``, plus the
    pool) to merge into ``DATABASES["default"]``. The pool: ``DB_POOL_MAX_SIZE`` connections at most (default
    16; 0: no pool; a negative size makes psycopg_pool refuse to start), ``DB_POOL_MIN_SIZE`` (2) kept open,
    idle ones beyond it closed after ``DB_POOL_MAX_IDLE_S`` (60) seconds, a call waiting up to
    ``DB_POOL_TIMEOUT_S`` (10) seconds for a free one."""
    options = dict(options)
    # A DATABASE_URL's own ``?options=...`` is kept, ours added after it.
    options["options"] = " ".join(filter(None, [options.get("options", ""), SESSION_OPTIONS]))
    max_size = env.int("DB_POOL_MAX_SIZE", default=16)
    if max_size:
        options["pool"] = {
            "min_size": min(max_size, env.int("DB_POOL_MIN_SIZE", default=2)),
            "max_size": max_size,
            "max_idle": env.float("DB_POOL_MAX_IDLE_S", default=60.0),
            "timeout": env.float("DB_POOL_TIMEOUT_S", default=10.0),
        }
    return {
        "ENGINE": "database.postgresql",  # Django's, with a pool check that costs no round trip (lever 32)
        "CONN_MAX_AGE": env.int("CONN_MAX_AGE", default=0),
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": options,
    }
