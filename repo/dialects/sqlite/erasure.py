"""What an erasure does on SQLite so the erased bytes leave the files.

- Its transactions run with ``PRAGMA secure_delete=ON``: SQLite overwrites deleted
  content with zeros (in the page and in the pages it frees).
- Afterwards the FTS5 index is merged into one segment (``optimize``): the terms of the
  deleted documents are otherwise kept in older segments until a merge reaches them.
- Then the WAL is checkpointed into the database and truncated to nothing
  (``wal_checkpoint(TRUNCATE)``), waiting for readers up to the busy timeout: the WAL
  holds the pages as they were before the erasure. A reader still holding it makes the
  scrub incomplete (reported; the next checkpoint completes it).

What stays: pages freed *before* the erasure without secure delete (an older edit, a
pruned session, an FTS merge) keep their bytes until reused; ``VACUUM`` rewrites the file
(:meth:`SQLiteErasure.compact_after_erasure`).
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.util import await_

from sessionrepo.dialects.aiosqlite_compat import on_connection_thread


class SQLiteErasure:
    """The SQLite dialect's erasure steps."""

    def prepare_erasure(self, connection: Connection) -> None:
        """Make the deletes of this transaction overwrite what they delete."""
        connection.exec_driver_sql("PRAGMA secure_delete=ON")

    def scrub_after_erasure(self, driver: Any, compact: bool) -> tuple[list[str], bool]:
        """Merge the search index, checkpoint and truncate the WAL (``compact``: and
        ``VACUUM`` the file first); the steps run and whether all completed."""
        if isinstance(driver, sqlite3.Connection):
            return _scrub(driver, compact)
        done: tuple[list[str], bool] = await_(on_connection_thread(driver, _scrub, compact))
        return done


def _scrub(connection: sqlite3.Connection, compact: bool) -> tuple[list[str], bool]:
    steps: list[str] = []
    connection.execute("PRAGMA secure_delete=ON")
    started = time.perf_counter()
    connection.execute("BEGIN IMMEDIATE")
    try:
        connection.execute("INSERT INTO messages_fts (messages_fts) VALUES ('optimize')")
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    steps.append(f"fts_optimize ({time.perf_counter() - started:.3f}s)")
    if compact:
        started = time.perf_counter()
        connection.execute("VACUUM")
        steps.append(f"vacuum ({time.perf_counter() - started:.3f}s)")
    free = connection.execute("PRAGMA freelist_count").fetchone()
    started = time.perf_counter()
    busy, frames, copied = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    complete = busy == 0 and frames == copied
    steps.append(
        f"wal_checkpoint(TRUNCATE) ({time.perf_counter() - started:.3f}s"
        f"{'' if complete else ', a reader held the WAL: incomplete'})"
    )
    steps.append(f"free pages left: {free[0] if free else 0}")
    return steps, complete
