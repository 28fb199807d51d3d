"""SQLite: one module per role of the dialect.

- :mod:`.engine`: the engine (WAL, busy timeout, the private store file) and the
  error codes' meaning;
- :mod:`.append`: the append's SQL, on SQLAlchemy's connection and on sqlite3's own;
- :mod:`.search`: the FTS5 search index;
- :mod:`.vectors`: the nearest vectors by sqlite-vec, where it loads;
- :mod:`.probes`: the PRAGMAs ``sessionrepo doctor`` judges;
- :mod:`.dialect`: :class:`SQLiteDialect`, the roles joined.
"""

from sessionrepo.dialects.sqlite.dialect import SQLiteDialect

__all__ = ["SQLiteDialect"]
