"""PostgreSQL: one module per role of the dialect.

- :mod:`.engine`: the engine (psycopg 3, UTC, the server's time bounds) and what each
  SQLSTATE means;
- :mod:`.append`: the append's SQL (one statement per append);
- :mod:`.search`: the ``tsvector`` search index;
- :mod:`.probes`: the settings ``sessionrepo doctor`` judges;
- :mod:`.dialect`: :class:`PostgresDialect`, the four joined.
"""

from sessionrepo.dialects.postgresql.dialect import PostgresDialect
from sessionrepo.dialects.postgresql.engine import MIGRATION_LOCK_KEY

__all__ = ["MIGRATION_LOCK_KEY", "PostgresDialect"]
