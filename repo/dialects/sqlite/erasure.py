"""What an erasure does on SQLite so the erased bytes leave the files.

- Its transactions run with ``PRAGMA secure_delete=ON``: SQLite overwrites deleted
  content with zeros (in the page and in the pages it frees).
- Afterwards the FTS5 index is merged into one segment (``optimize``): the terms of the
  deleted documents are otherwise kept in older segments until a merge reaches them.
- Then the WAL is checkpointed into the database and truncated to nothing
  (``wal_checkpoint(TRUNCATE)``), waiting for readers up to the busy timeout: the WAL
  holds the pages as they were before the erasure. A reader still holding it makes the
  scrub incomplete (reported; the next checkpoint completes it).

- Before the checkpoint, every page on the free list is overwritten with zeros: pages
  freed *before* the erasure without secure delete (an FTS merge of the index, an older
  prune or edit) may hold the erased words. A table of zero blobs takes the free pages
  (SQLite reuses them before growing the file) and is dropped in the same transaction,
  so it is never seen; it costs a write of each free page, not a rewrite of the file
  (``compact``: ``VACUUM`` does that).
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

    def truncate_wal(self, driver: Any) -> bool:
        if isinstance(driver, sqlite3.Connection):
            return _truncate_wal(driver)
        done: bool = await_(on_connection_thread(driver, _truncate_wal))
        return done


def _truncate_wal(connection: sqlite3.Connection) -> bool:
    busy, frames, copied = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return bool(busy == 0 and frames == copied)


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
    started = time.perf_counter()
    zeroed = _zero_free_pages(connection)
    steps.append(f"zeroed {zeroed} free pages ({time.perf_counter() - started:.3f}s)")
    started = time.perf_counter()
    busy, frames, copied = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    complete = busy == 0 and frames == copied
    steps.append(
        f"wal_checkpoint(TRUNCATE) ({time.perf_counter() - started:.3f}s"
        f"{'' if complete else ', a reader held the WAL: incomplete'})"
    )
    return steps, complete


#: The transient table that takes the free pages (never committed: dropped in the same
#: transaction that made it).
_SCRUB_TABLE = "sessionrepo_scrub_free_pages"


def _zero_free_pages(connection: sqlite3.Connection) -> int:
    """Overwrite every page on the free list with zeros; how many there were."""
    free = int(connection.execute("PRAGMA freelist_count").fetchone()[0])
    if not free:
        return 0
    page_size = int(connection.execute("PRAGMA page_size").fetchone()[0])
    connection.execute("BEGIN IMMEDIATE")
    try:
        connection.execute(f"CREATE TABLE {_SCRUB_TABLE} (b BLOB)")
        while (left := int(connection.execute("PRAGMA freelist_count").fetchone()[0])) > 0:
            # A blob of overflow pages takes that many free pages (less a little room
            # for the cell's header: the last page may stay partly unused).
            size = min(left, 1024) * (page_size - 8)
            connection.execute(f"INSERT INTO {_SCRUB_TABLE} (b) VALUES (zeroblob(?))", (size,))
        connection.execute(f"DROP TABLE {_SCRUB_TABLE}")
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    return free
