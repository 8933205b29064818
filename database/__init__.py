"""Database helpers shared by every layer: closing connections under ASGI and in async code
(:mod:`database.connections`), riding out a short PostgreSQL outage (:mod:`database.outages`), and
telling text PostgreSQL cannot store (:mod:`database.storable_text`). Imports no app."""
