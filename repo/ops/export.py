"""Export sessions to a file: the format, and the writer that prune reuses.

Export format
-------------

JSON Lines: UTF-8, one JSON object per line, each line ending in ``"\\n"`` (JSON escapes
every control character inside strings, so a line break is always a record boundary;
readers must split on ``"\\n"`` only, not on U+2028 and friends). Every record has a
``type``; they come in this order::

    {"type": "header", "format": "sessionrepo-export", "version": 1,
     "exported_at": "2026-11-29T11:38:45.052864Z"}
    {"type": "session", "next_seq": 3, "session": {"id": "discord:42", "source": "discord",
     ..., "model_settings": {...}, ..., "metadata": {...}, "last_active_at": "..."}}
    {"type": "message", "session_id": "discord:42", "seq": 1, "message": {
     "client_msg_uuid": "0193…", "role": "user", "content": "hi", ..., "timestamp": "…Z",
     ..., "extra": {...}, "openai_keys": ["role", "content"]}}
    {"type": "message", "session_id": "discord:42", "seq": 2, "message": {...}}
    {"type": "usage", "session_id": "discord:42", "usage": {"usage_id": "…",
     "message_uuid": "0193…", "model": "gpt-4.1", "input_tokens": 1200, ...}}
    {"type": "session", ...}                     (the next session, then its messages)
    {"type": "end", "sessions": 1, "messages": 2, "usage": 1}

- ``session`` is :class:`models.Session` dumped with ``model_dump(mode="json",
  by_alias=True)``: every field, the counters, ``ended_at``/``end_reason`` and
  ``last_active_at`` included. (Files written before schema revision 0009 call
  ``model_settings`` ``model_config``; import reads either.) ``next_seq`` is the ``seq``
  the session's next message would get. A session's messages follow it, ``seq`` ascending:
  exactly those with ``seq < next_seq`` when the session was read, so the record and its
  messages are one consistent snapshot even while gateways keep writing.
- ``message`` is :class:`models.Message` dumped with ``model_dump(mode="json")``: the key,
  every wire field, ``timestamp`` (UTC, microseconds), ``extra`` (key order kept) and
  ``openai_keys`` (the key order ``to_openai()`` gives back), beside its ``seq``, and
  ``superseded`` (``null``, or why an edit took it out of the live transcript: every
  stored message is exported, history included, and imported as it was).
- ``usage`` (version 2 on) is one record of the session's usage ledger
  (:class:`models.usage.Usage` dumped with ``model_dump(mode="json")``: its key, the
  message it produced, model, provider, tokens, latency, reported cost, time, ``extra``),
  after the session's messages, oldest first. Version 1 files have none, and no
  ``usage`` count in ``end``; they import as they are.
- ``end`` closes the file with its totals. A file without it was cut short (a full disk,
  a killed process); :func:`sessionrepo.ops.import_sessions` imports what it holds and
  says so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Final

from pydantic import BaseModel, ConfigDict

from sessionrepo.errors import NotFound, RepoError
from sessionrepo.models import Session
from sessionrepo.models.message import utcnow
from sessionrepo.ops import records
from sessionrepo.store.repository import SessionFilter, SessionRepository, SessionSnapshot

EXPORT_FORMAT: Final = "sessionrepo-export"
EXPORT_VERSION: Final = 2
#: The versions :func:`sessionrepo.ops.import_sessions` reads (1: no usage records).
READABLE_VERSIONS: Final = (1, 2)
#: Sessions read per page while exporting; messages read per page of a transcript.
PAGE: Final = 500

#: Which sessions to export: given ids, or those matching every filter set.
Selection = SessionFilter


def create_private_file(path: Path) -> IO[bytes]:
    """A new file at ``path``, open for writing, readable by its owner only (mode 0600:
    an export or a report holds private conversations). Never an existing file, nor one
    reached through a symbolic link (``O_EXCL``).

    Raises:
        FileExistsError: something is at ``path`` already.
        OSError: the file cannot be created.
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    return os.fdopen(descriptor, "wb")


class BadExportFile(RepoError):
    """The file is not a sessionrepo export, or is damaged at the line named."""


def count_sessions(repository: SessionRepository, selection: Selection) -> int:
    """How many sessions ``selection`` names (for a progress bar).

    Raises:
        NotFound: a session id given in the selection does not exist.
    """
    found = repository.count_sessions(selection)
    wanted = set(selection.session_ids)
    if wanted and found < len(wanted):
        present = {snapshot.session.id for snapshot in snapshots(repository, selection)}
        missing = sorted(wanted - present)
        raise NotFound(f"no session {', '.join(repr(m) for m in missing)}")
    return found


def snapshots(
    repository: SessionRepository, selection: Selection, page: int = PAGE
) -> Iterator[SessionSnapshot]:
    """Every session ``selection`` names, by id, a page per read."""
    for batch in snapshot_pages(repository, selection, page):
        yield from batch


def snapshot_pages(
    repository: SessionRepository, selection: Selection, page: int
) -> Iterator[list[SessionSnapshot]]:
    """The sessions ``selection`` names, by id, in pages of ``page``."""
    after: str | None = None
    while True:
        batch = repository.session_snapshots(selection, after_id=after, limit=page)
        if batch:
            yield batch
        if len(batch) < page:
            return
        after = batch[-1].session.id


class ExportReport(BaseModel):
    """What one export wrote."""

    model_config = ConfigDict(frozen=True)

    sessions: int = 0
    messages: int = 0
    #: Usage records (model calls) written with their sessions.
    usage: int = 0
    #: Sessions deleted between being listed and being read (not in the file).
    vanished: int = 0


class ExportWriter:
    """Writes the records of the format above to a binary stream."""

    def __init__(self, repository: SessionRepository, out: IO[bytes]) -> None:
        self._repository = repository
        self._out = out
        self.sessions = 0
        self.messages = 0
        self.usage = 0
        self.vanished = 0

    def _write(self, record: dict[str, Any]) -> None:
        self._out.write(records.line(record))

    def header(self) -> None:
        self._write(
            {
                "type": "header",
                "format": EXPORT_FORMAT,
                "version": EXPORT_VERSION,
                "exported_at": utcnow().isoformat().replace("+00:00", "Z"),
            }
        )

    def session(self, snapshot: SessionSnapshot) -> Session | None:
        """Write one session and its messages; ``None`` when it was deleted meanwhile."""
        session = snapshot.session
        after = 0
        written = False
        while True:
            try:
                page = self._repository.load_transcript(
                    session.id,
                    after_seq=after,
                    before_seq=snapshot.next_seq,
                    limit=PAGE,
                    include_retracted=True,  # history too: an import reproduces it
                )
            except NotFound:
                if not written:
                    self.vanished += 1
                    return None
                raise RepoError(
                    f"session {session.id!r} was deleted while it was being exported"
                ) from None
            if not written:
                self._write(
                    {
                        "type": "session",
                        "next_seq": snapshot.next_seq,
                        "session": session.model_dump(mode="json", by_alias=True),
                    }
                )
                written = True
            for message in page:
                self._write(records.message_record(message))
            self.messages += len(page)
            if len(page) < PAGE:
                break
            after = page[-1].seq
        for usage in self._repository.list_usage(session.id):
            self._write(records.usage_record(session.id, usage))
            self.usage += 1
        self.sessions += 1
        return session

    def trailer(self) -> None:
        self._write(
            {
                "type": "end",
                "sessions": self.sessions,
                "messages": self.messages,
                "usage": self.usage,
            }
        )

    def sync(self) -> None:
        """Make what was written durable (a file), or at least handed on (a pipe)."""
        self._out.flush()
        # A pipe, a terminal, an in-memory buffer: nothing to sync.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.fsync(self._out.fileno())

    def report(self) -> ExportReport:
        return ExportReport(
            sessions=self.sessions,
            messages=self.messages,
            usage=self.usage,
            vanished=self.vanished,
        )


def export_sessions(
    repository: SessionRepository,
    out: IO[bytes],
    selection: Selection | None = None,
    *,
    on_session: Callable[[Session], None] | None = None,
) -> ExportReport:
    """Write the selected sessions and their messages to ``out`` (see the module
    docstring), streaming: a page of sessions and a page of messages at a time.

    Args:
        out: a binary stream; it is flushed (and synced when it is a file) at the end.
        selection: which sessions (default: all).
        on_session: called after each session is written (progress).

    Raises:
        NotFound: a session id given in the selection does not exist.
    """
    selection = selection or Selection()
    if selection.session_ids:
        count_sessions(repository, selection)  # refuse a missing id before writing
    writer = ExportWriter(repository, out)
    writer.header()
    for snapshot in snapshots(repository, selection):
        session = writer.session(snapshot)
        if session is not None and on_session is not None:
            on_session(session)
    writer.trailer()
    writer.sync()
    return writer.report()
