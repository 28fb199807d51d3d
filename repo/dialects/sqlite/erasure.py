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

- Before the free pages, the unused space inside the pages of the tables that hold what
  a user said (messages, their search text and index segments, sessions, outbox and
  ADK rows) is overwritten too. When SQLite rebalances a b-tree it rewrites a page's
  cells at the page's end and leaves the bytes below them as they were: a copy of a row
  that moved to a neighbour stays in the page's unused space, and secure delete later
  zeroes the row where it lives, not that copy. Deleting many rows rebalances a lot
  (one erased word in a million messages survived that way). The scrub reads those
  pages in the file (after a checkpoint, under the write lock, so the file is the
  database) and, in each page whose unused space holds old bytes (four in a row that
  are not zeros: text has no zero byte), grows one row's column by exactly that space
  and puts it back: SQLite packs the page's cells and writes the grown row over all of
  it, then zeroes the row's old place (secure delete). Only such pages are written
  (those a rebalance or an out-of-order insert left bytes in since the last scrub); the
  row is as it was after, in the same transaction. Not reached: the pages of indexes
  (their keys are ids, but the FTS5 ``_idx`` keeps the first term of each index page)
  and a page none of whose rows can grow within it (reported).
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
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
        """Merge the search index (``compact``: and ``VACUUM`` the file), zero the
        unused space of the pages that hold content and the free pages, checkpoint
        and truncate the WAL; the steps run and whether all completed."""
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
    rewritten = _zero_unused_space(connection)
    took = time.perf_counter() - started
    if rewritten is None:
        steps.append(f"unused space not zeroed ({took:.3f}s, a reader held the WAL)")
    else:
        done, left = rewritten
        steps.append(
            f"zeroed the unused space of {done} pages ({took:.3f}s"
            f"{f', {left} not (no row to grow)' if left else ''})"
        )
    started = time.perf_counter()
    zeroed = _zero_free_pages(connection)
    steps.append(f"zeroed {zeroed} free pages ({time.perf_counter() - started:.3f}s)")
    started = time.perf_counter()
    busy, frames, copied = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    checkpointed = busy == 0 and frames == copied
    steps.append(
        f"wal_checkpoint(TRUNCATE) ({time.perf_counter() - started:.3f}s"
        f"{'' if checkpointed else ', a reader held the WAL: incomplete'})"
    )
    return steps, checkpointed and rewritten is not None


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


#: The tables whose rows hold what a user said, each with the column the scrub grows to
#: overwrite a page's unused space: one that takes any value and is in no index, key or
#: CHECK (its value is put back in the same transaction).
_GROWN = {
    "messages": "content",
    "messages_fts_content": "c3",
    "messages_fts_data": "block",
    "sessions": "title",
    "pending_outbox": "message",
    "adk_sessions": "state",
    "adk_user_states": "state",
    "adk_app_states": "state",
}
#: Times a page is grown at most (see _zero_unused_space).
_PASSES = 3
_TABLE_LEAF = 13
#: Below it, two bytes after a page's cell pointers are a stale pointer (see _clean).
_POINTER_LIMIT = 4096
#: What makes unused space not clean: four bytes in a row none of which is zero (text
#: has no zero byte; fewer than four left of a cell's header or a pointer hold no word).
_WORD = re.compile(rb"[^\x00]{4}")


def _zero_unused_space(connection: sqlite3.Connection) -> tuple[int, int] | None:
    """Overwrite the unused space of the leaf pages of :data:`_GROWN`'s tables where it
    is not clean (see :func:`_clean`); how many pages were rewritten and how many were
    left, ``None`` when the WAL could not be emptied first (a reader held it)."""
    path = _main_file(connection)
    if path is None:
        return 0, 0
    wal = path.with_name(path.name + "-wal")
    rewritten: set[int] = set()
    stuck = 0
    # Every leaf of the tables first, then only the pages grown, read again after the
    # commit (a row whose record was not as its table now describes it, a column added
    # since, can miss by a few bytes: grown again).
    pages: list[tuple[str, int]] | None = None
    for attempt in range(_PASSES + 1):
        # The file is the database only with the WAL emptied and the write lock held
        # (a writer that came in between the two: given up, the next scrub does it).
        if not _truncate_wal(connection):
            return None
        connection.execute("BEGIN IMMEDIATE")
        try:
            if wal.exists() and wal.stat().st_size:
                connection.execute("ROLLBACK")
                return None
            dirty = list(_dirty_pages(connection, path, pages))
            if attempt == _PASSES:
                connection.execute("COMMIT")
                return len(rewritten), stuck + len(dirty)
            pages = []
            for table, number, page in dirty:
                if _regrow(connection, table, page):
                    pages.append((table, number))
                else:
                    stuck += 1  # no row of it can take the space: not tried again
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        rewritten.update(number for _table, number in pages)
        if not pages:
            break
    return len(rewritten), stuck


def _main_file(connection: sqlite3.Connection) -> Path | None:
    for _seq, name, file in connection.execute("PRAGMA database_list"):
        if name == "main":
            return Path(file) if file else None
    return None


def _dirty_pages(
    connection: sqlite3.Connection, path: Path, only: list[tuple[str, int]] | None
) -> Iterator[tuple[str, int, bytes]]:
    """The leaf pages of :data:`_GROWN`'s tables (``only``: of these, by table and
    number) whose unused space (the gap between the cell pointers and the cells, and
    the free blocks' bodies) is not clean: table, page number and the page's bytes."""
    size = int(connection.execute("PRAGMA page_size").fetchone()[0])
    present = {row[0] for row in connection.execute("SELECT name FROM sqlite_schema")}
    descriptor = os.open(path, os.O_RDONLY)
    try:
        # The bytes at each page's end an extension may reserve are not the b-tree's.
        usable = size - os.pread(descriptor, 21, 0)[20]
        if only is None:
            only = [
                (table, number)
                for table in _GROWN
                if table in present
                for (number,) in connection.execute(
                    "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf'", (table,)
                )
            ]
        for table, number in only:
            page = os.pread(descriptor, size, (number - 1) * size)[:usable]
            if number != 1 and page[0] == _TABLE_LEAF and not _clean(page):
                yield table, number, page
    finally:
        os.close(descriptor)


def _layout(page: bytes) -> tuple[int, int, list[tuple[int, int]], int]:
    """A table leaf page's number of cells, where its cell content starts, its free
    blocks (offset, size) and its fragmented bytes (the page as its usable bytes)."""
    start = int.from_bytes(page[5:7], "big") or 65536
    blocks: list[tuple[int, int]] = []
    block = int.from_bytes(page[1:3], "big")
    while block and len(blocks) < len(page) // 4:
        blocks.append((block, int.from_bytes(page[block + 2 : block + 4], "big")))
        block = int.from_bytes(page[block : block + 2], "big")
    return int.from_bytes(page[3:5], "big"), start, blocks, page[7]


def _clean(page: bytes) -> bool:
    """Whether a table leaf page's unused space holds no four bytes in a row that are
    not zero, stale cell pointers aside."""
    cells, start, blocks, _fragments = _layout(page)
    # Right after the cell pointers, the slots of cells moved or deleted keep their
    # last pointer (SQLite shifts the array, it does not clear its end): offsets in the
    # page, not content. Two bytes of text are never below 4096 (0x10 00).
    end = 8 + 2 * cells
    limit = min(len(page), _POINTER_LIMIT)
    while end + 2 <= start and int.from_bytes(page[end : end + 2], "big") < limit:
        end += 2
    if end + 1 == start and page[end] < limit >> 8:
        end = start  # the first byte of a pointer whose second the cells now cover
    if _WORD.search(page, end, start):
        return False
    return not any(_WORD.search(page, at + 4, at + length) for at, length in blocks)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """SQLite's varint at ``at``: its value and the offset after it."""
    value = 0
    for i in range(8):
        byte = data[at + i]
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + i + 1
    return (value << 8) | data[at + 8], at + 9


def _varint_size(value: int) -> int:
    size = 1
    while value > 0x7F and size < 9:
        value >>= 7
        size += 1
    return size


def _header_size(types: int) -> int:
    """A record header's size holding serial types of ``types`` bytes (as SQLite's
    ``OP_MakeRecord`` counts it: the size's own varint included)."""
    if types <= 126:
        return types + 1
    size = types + _varint_size(types)
    return size + 1 if _varint_size(types) < _varint_size(size) else size


def _content_size(serial: int) -> int:
    if serial >= 12:
        return (serial - 12) // 2
    return (0, 1, 2, 3, 4, 6, 8, 8, 0, 0)[serial] if serial < 10 else -1


def _regrow(connection: sqlite3.Connection, table: str, page: bytes) -> bool:
    """Grow one row of ``page`` (a leaf of ``table``) by all of the page's unused space,
    then put it back (see the module's docstring); whether a row could take it."""
    column = _GROWN[table]
    index = [row[1] for row in connection.execute(f"PRAGMA table_info({table})")].index(column)
    cells, start, blocks, fragments = _layout(page)
    offsets = [int.from_bytes(page[8 + 2 * i : 10 + 2 * i], "big") for i in range(cells)]
    unused = start - (8 + 2 * cells) + sum(size for _at, size in blocks) + fragments
    local = len(page) - 35  # the most payload a table leaf's cell keeps in the page
    for at in offsets:
        payload, after = _varint(page, at)
        rowid, body = _varint(page, after)
        if payload > local:
            continue  # part of it in overflow pages: its cell's size is not its own
        header, cursor = _varint(page, body)
        serials = []
        while cursor < body + header:
            serial, cursor = _varint(page, cursor)
            serials.append(serial)
        if len(serials) <= index or not (serials[index] == 0 or serials[index] >= 12):
            continue  # a column added since (or a number): its record would change size
        old = _content_size(serials[index])
        types = header - _varint_size(header) - _varint_size(serials[index])
        data = payload - header - old
        wanted = (body - at) + payload + unused  # the whole page taken
        grown = _fit(types, data, rowid, wanted, local)
        if grown is None:
            continue
        kind, value = connection.execute(
            f"SELECT typeof({column}), CAST({column} AS BLOB) FROM {table} WHERE rowid = ?",
            (rowid,),
        ).fetchone()
        connection.execute(
            f"UPDATE {table} SET {column} = zeroblob(?) WHERE rowid = ?", (grown, rowid)
        )
        restore = "CAST(? AS TEXT)" if kind == "text" else "?"
        connection.execute(
            f"UPDATE {table} SET {column} = {restore} WHERE rowid = ?", (value, rowid)
        )
        return True
    return False


def _fit(types: int, data: int, rowid: int, wanted: int, local: int) -> int | None:
    """The length of a blob that makes the row's cell ``wanted`` bytes (or one or two
    less where the varints jump), its other columns as they are; ``None`` if the cell
    would spill out of the page."""
    best = None
    estimate = max(0, wanted - data - types - 6)
    for length in range(estimate + 8, max(-1, estimate - 8), -1):
        serial = 2 * length + 12
        payload = _header_size(types + _varint_size(serial)) + data + length
        cell = _varint_size(payload) + _varint_size(rowid) + payload
        if payload <= local and cell <= wanted:
            best = length
            break
    if best is None:
        return None
    return best
