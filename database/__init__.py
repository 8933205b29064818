"""Database helpers shared by every layer: closing connections under ASGI and in async code
(:mod:`database.connections`), and riding out a short PostgreSQL outage (:mod:`database.outages`).
Imports no app."""
