"""The PostgreSQL backend every process runs (``ENGINE = "database.postgresql"``): Django's own, whose
connection pool checks a connection it hands out without a round trip (:mod:`database.postgresql.base`)."""
