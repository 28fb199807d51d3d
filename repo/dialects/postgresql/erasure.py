"""What an erasure does on PostgreSQL after its deletes: ``VACUUM`` of the tables it
deleted from, so the dead row versions and index entries are removed and their space
reusable. What stays physically (dead space until reused, the WAL until recycled and
archived, base backups and replicas' copies) is the server's and the operator's: see the
README's "Privacy and retention"."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from sqlalchemy import Connection
from sqlalchemy.util import await_

#: The tables an erasure deletes from.
ERASED_TABLES = (
    "messages",
    "message_search",
    "search_backlog",
    "sessions",
    "pending_outbox",
    "adk_sessions",
    "adk_user_states",
)


class PostgresErasure:
    """The PostgreSQL dialect's erasure steps."""

    def prepare_erasure(self, connection: Connection) -> None:
        """Nothing to set: a deleted row's bytes go with ``VACUUM``."""
        return

    def scrub_after_erasure(self, driver: Any, compact: bool) -> tuple[list[str], bool]:
        """``VACUUM`` (``compact``: ``VACUUM FULL``, which rewrites each table under an
        exclusive lock) of every table an erasure deletes from."""
        steps: list[str] = []
        command = "VACUUM (FULL)" if compact else "VACUUM"
        asynchronous = isinstance(driver, psycopg.AsyncConnection)
        if asynchronous:
            await_(driver.set_autocommit(True))
        else:
            driver.autocommit = True
        try:
            for table in ERASED_TABLES:
                started = time.perf_counter()
                statement = f"{command} {table}"
                if asynchronous:
                    await_(driver.execute(statement))
                else:
                    driver.execute(statement)
                steps.append(f"{statement} ({time.perf_counter() - started:.3f}s)")
        finally:
            if asynchronous:
                await_(driver.set_autocommit(False))
            else:
                driver.autocommit = False
        return steps, True
