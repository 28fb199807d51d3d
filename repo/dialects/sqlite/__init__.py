"""SQLite: one module per role of the dialect.

- :mod:`.engine`: the engine (WAL, busy timeout, the private store file) and the
  error codes' meaning;
- :mod:`.append`: the append's SQL, on SQLAlchemy's connection and on sqlite3's own;
- :mod:`.search`: the FTS5 search index;
- :mod:`.probes`: the PRAGMAs ``sessionrepo doctor`` judges;
- :mod:`.dialect`: :class:`SQLiteDialect`, the four joined.
"""

from sessionrepo.dialects.sqlite.dialect import SQLiteDialect

__all__ = ["SQLiteDialect"]
