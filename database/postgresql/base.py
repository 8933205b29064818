"""Django's PostgreSQL backend with a pool whose health check costs no round trip (docs/overhead-levers.md, lever 32).

With ``OPTIONS["pool"]`` and ``CONN_HEALTH_CHECKS``, Django builds psycopg's pool with
``ConnectionPool.check_connection``, which sends an empty query to the server every time a connection is
handed out: one PostgreSQL round trip more per database call (every consumer ``db_call``, every worker
claim and final write). :func:`check_pooled_connection` asks the kernel instead: a pooled connection is idle,
so the server has nothing to say on it; a connection the server ended (a restart, ``pg_terminate_backend``,
``idle_session_timeout``) has the server's error and end-of-file waiting on its socket, and only then is the
round trip made, which raises and makes the pool take another connection. A connection whose peer vanished
without a word (a host gone off the network) passes, as it would pass between a check and the query that
follows one; its query then fails and ``database.outages`` retries where the caller asked it to.
"""

from __future__ import annotations

import select

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from psycopg import pq


def check_pooled_connection(conn: psycopg.Connection) -> None:
    """psycopg_pool's ``check`` callable: return if ``conn`` (an idle pooled connection) is usable, raise
    ``psycopg.OperationalError`` if not. Costs a ``poll`` of its socket; an empty query only when the socket
    has something to read (the server ended the connection, or sent an asynchronous message, which the
    query then consumes)."""
    if conn.closed or conn.pgconn.status != pq.ConnStatus.OK:
        raise psycopg.OperationalError("the pooled connection is closed")
    poller = select.poll()  # not select.select: a busy web process's descriptors pass FD_SETSIZE
    poller.register(conn.fileno(), select.POLLIN)
    if poller.poll(0):
        psycopg_pool_check(conn)


def psycopg_pool_check(conn: psycopg.Connection) -> None:
    """psycopg_pool's own check: one empty query (raises ``psycopg.OperationalError`` on a dead connection)."""
    from psycopg_pool import ConnectionPool

    ConnectionPool.check_connection(conn)


class DatabaseWrapper(base.DatabaseWrapper):
    """Django's PostgreSQL wrapper; only the pool's ``check`` differs (Django 5.2's ``pool`` property
    otherwise, which passes ``check`` itself, so it cannot come through ``OPTIONS["pool"]``)."""

    @property
    def pool(self):
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not pool_options:
            return None
        if self.alias not in self._connection_pools:
            if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
                raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
            from psycopg_pool import ConnectionPool

            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # as Django's: it sets autocommit itself later on
            pool = ConnectionPool(
                kwargs=connect_kwargs,
                open=False,  # opened by the first connection, as Django's
                configure=self._configure_connection,
                check=check_pooled_connection if self.settings_dict["CONN_HEALTH_CHECKS"] else None,
                **({} if pool_options is True else pool_options),
            )
            self._connection_pools.setdefault(self.alias, pool)
        return self._connection_pools[self.alias]
