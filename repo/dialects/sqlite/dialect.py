"""The SQLite dialect: its roles joined, and what it can do."""

from __future__ import annotations

from sessionrepo.dialects.base import BackendDialect, Capabilities
from sessionrepo.dialects.sqlite.append import SQLiteAppend
from sessionrepo.dialects.sqlite.engine import SQLiteEngine
from sessionrepo.dialects.sqlite.erasure import SQLiteErasure
from sessionrepo.dialects.sqlite.probes import SQLiteProbes
from sessionrepo.dialects.sqlite.search import SQLiteSearch
from sessionrepo.dialects.sqlite.vectors import SQLiteVectors


class SQLiteDialect(
    SQLiteEngine,
    SQLiteAppend,
    SQLiteSearch,
    SQLiteVectors,
    SQLiteProbes,
    SQLiteErasure,
    BackendDialect,
):
    """SQLite in WAL mode through the standard library driver (``aiosqlite`` for asyncio)."""

    name = "sqlite"
    display_name = "SQLite"
    capabilities = Capabilities(
        migrates_on_open=True,
        connect_may_hang=False,
        retry_waits_out_bound=True,
        screens_erasure=True,
    )
