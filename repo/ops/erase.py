"""``verify-erased``: is any of these strings still in the store?

Two looks, both content searches the caller asks for by giving the strings:

- the rows: every text column that can hold what a user said (messages' content,
  reasoning, tool calls, ``extra``; sessions' title, system prompt, metadata; this
  database's outbox rows; ADK state), by substring, and the search index, by
  :meth:`SessionRepository.search`;
- on SQLite, the bytes: the database file, its ``-wal`` and ``-journal``, and any other
  file given (a gateway's outbox file and its WAL), scanned for each string's UTF-8
  bytes. PostgreSQL's files are the server's: the rows and the index are what a client
  can check (the README says what stays on the server's disk and for how long).

Nothing found is not proof that no copy exists elsewhere (an export, a backup, a log).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection, Text, select, type_coerce

from sessionrepo.dialects import database_file
from sessionrepo.models.adk import adk_app_states_table, adk_sessions_table, adk_user_states_table
from sessionrepo.models.tables import messages_table, outbox_table, sessions_table
from sessionrepo.store.repository import SessionRepository

__all__ = ["Finding", "VerifyReport", "scan_file", "verify_erased"]

#: Bytes read at a time from a file (with an overlap of the longest string).
_BLOCK = 1 << 20

_COLUMNS: tuple[tuple[str, Any], ...] = (
    *(
        (f"messages.{name}", messages_table.c[name])
        for name in ("content", "reasoning", "tool_calls", "extra")
    ),
    *(
        (f"sessions.{name}", sessions_table.c[name])
        for name in ("title", "system_prompt", "metadata")
    ),
    ("pending_outbox.message", outbox_table.c.message),
    ("adk_sessions.state", adk_sessions_table.c.state),
    ("adk_user_states.state", adk_user_states_table.c.state),
    ("adk_app_states.state", adk_app_states_table.c.state),
)


class Finding(BaseModel):
    """Where one string was found."""

    model_config = ConfigDict(frozen=True)

    #: Which of the strings (its index in the list given: the report holds no content).
    text: int
    #: ``rows:<table.column>``, ``search``, or ``file:<path>``.
    where: str
    #: Rows, hits or byte occurrences.
    count: int


class VerifyReport(BaseModel):
    """What ``verify_erased`` looked at and found."""

    model_config = ConfigDict(frozen=True)

    texts: int
    #: What was scanned: ``rows``, ``search``, and each file by path.
    scanned: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.findings


def verify_erased(
    repository: SessionRepository,
    texts: Sequence[str],
    *,
    files: Iterable[Path] = (),
) -> VerifyReport:
    """Look for each of ``texts`` in the store's rows, its search index and, on SQLite,
    its files' bytes; and in ``files`` (a gateway's outbox file, for example).

    Raises:
        ValueError: no strings, or an empty one.
    """
    wanted = list(texts)
    if not wanted or any(not isinstance(t, str) or not t for t in wanted):
        raise ValueError("give at least one non-empty string to look for")
    findings: list[Finding] = []
    scanned = ["rows", "search"]
    findings += repository.database.read(lambda conn: _rows(conn, wanted))
    for index, value in enumerate(wanted):
        hits = len(repository.search(f'"{value}"', limit=100))
        if hits:
            findings.append(Finding(text=index, where="search", count=hits))
    paths: list[Path] = []
    main = database_file(repository.database.url)
    if main is not None:
        paths += [main, *(main.with_name(main.name + s) for s in ("-wal", "-journal"))]
    for extra in files:
        paths += [extra, extra.with_name(extra.name + "-wal")]
    for path in dict.fromkeys(paths):
        if not path.exists():
            continue
        scanned.append(f"file:{path}")
        for index, amount in scan_file(path, wanted).items():
            findings.append(Finding(text=index, where=f"file:{path}", count=amount))
    return VerifyReport(texts=len(wanted), scanned=scanned, findings=findings)


def _rows(conn: Connection, texts: Sequence[str]) -> list[Finding]:
    findings = []
    for index, value in enumerate(texts):
        for name, column in _COLUMNS:
            query = select(1).where(type_coerce(column, Text).contains(value, autoescape=True))
            amount = len(conn.execute(query.limit(1000)).all())
            if amount:
                findings.append(Finding(text=index, where=f"rows:{name}", count=amount))
    return findings


def scan_file(path: Path, texts: Sequence[str]) -> dict[int, int]:
    """How often each of ``texts`` (by index) occurs in ``path``'s bytes, as UTF-8."""
    needles = [t.encode() for t in texts]
    overlap = max(len(n) for n in needles) - 1
    found: dict[int, int] = {}
    tail = b""
    with path.open("rb") as stream:
        while True:
            block = stream.read(_BLOCK)
            if not block:
                break
            window = tail + block
            for index, needle in enumerate(needles):
                # Occurrences starting in this block's new bytes only (the tail's were
                # counted with the block before).
                start = 0
                while (at := window.find(needle, start)) != -1:
                    if at + len(needle) > len(tail):
                        found[index] = found.get(index, 0) + 1
                    start = at + 1
            tail = window[-overlap:] if overlap else b""
    return found
