"""Fault drills against a running chatsite stack (``manage.py drills``), also driven by the integration tests.

Each drill injects one fault (a worker SIGKILLed mid-stream, PostgreSQL refusing connections for 10 s, a
burst of sends at 10x a worker's capacity, hostile frames, optionally a Redis restart) while real clients
talk to daphne over WebSockets, and reports a :class:`DrillResult`: trials, time to recovery, replies lost
(a ``send`` answered ``queued`` whose reply never reached a final state or vanished) and replies stuck
(still ``queued``/``streaming`` in PostgreSQL when the drill's deadline passed).
"""

from devtools.drills.report import DrillResult, format_table

__all__ = ["DrillResult", "format_table"]
