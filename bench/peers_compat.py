"""The peers' and SQLAlchemy's privates the bench reads, in one place (see rule 3 of
tools/import_rules.py): what a contender's settings report needs and no public API gives.
Bounded by the bench group's pins (``openai-agents~=0.24.0``) and the core's
``sqlalchemy<2.2``; ``make bench``'s smoke run (CI) reads both, so a version without them
fails there.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import Any


def sqlite_session_connection(session: Any) -> AbstractContextManager[sqlite3.Connection]:
    """An OpenAI Agents ``SQLiteSession``'s own sqlite3 connection, under its lock (the
    session's PRAGMAs are per connection: a connection of the bench's own would not show
    them)."""
    connection: AbstractContextManager[sqlite3.Connection] = session._locked_connection()
    return connection


def pool_pre_ping(pool: Any) -> bool:
    """Whether a SQLAlchemy pool pings each connection on checkout (``pool_pre_ping``)."""
    return bool(getattr(pool, "_pre_ping", False))
