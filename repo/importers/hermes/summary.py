"""What a Hermes import reports: its summary, the problems it lists, its errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sessionrepo.errors import RepoError


class HermesSourceError(RepoError):
    """The Hermes home or ``state.db`` cannot be read (missing, not a Hermes store, corrupt)."""


class HermesImportError(RepoError):
    """The import stopped part-way (the store failed). Run it again to continue.

    Attributes:
        summary: what was done before it stopped.
    """

    def __init__(self, message: str, summary: HermesImportSummary) -> None:
        super().__init__(message)
        self.summary = summary


class Problem(BaseModel):
    """One value, row or file the import had to treat specially."""

    model_config = ConfigDict(frozen=True)

    #: The source row or spool element: ``state.db messages.id=42``,
    #: ``state.db sessions.id='abc'``, ``pending_messages/pending-….json messages[2]``.
    where: str
    #: The session (as stored) it belongs to.
    session_id: str | None = None
    field: str | None = None
    problem: str
    #: Where the original value was put, if it was not stored in its field.
    stored_as: str | None = None


class SpoolFile(BaseModel):
    """One file of ``pending_messages/``."""

    model_config = ConfigDict(frozen=True)

    name: str
    #: 1-4 (see ``KIND_NAMES``); ``None`` when it could not be read or recognised.
    kind: int | None = None
    kind_name: str | None = None
    session_id: str | None = None
    #: The routing key (``agent:main:telegram:dm:42``) of kinds 1 to 3.
    session_key: str | None = None
    #: Transcript messages it holds (kinds 3 and 4).
    messages: int = 0
    #: Why it was not imported (it stays in the spool, unchanged).
    error: str | None = None


class HermesImportSummary(BaseModel):
    """What one :func:`import_hermes` run read, stored, and set aside."""

    model_config = ConfigDict(frozen=True)

    source: str
    #: The store imported into (password masked), when the caller sets it.
    target: str | None = None
    state_db: str | None = None
    #: ``schema_version`` of ``state.db`` (``None`` when it has no such table).
    schema_version: int | None = None
    spool_dir: str | None = None
    #: A ``pending_messages/`` beside a ``state.db`` given alone: it was not read.
    spool_not_read: str | None = None

    #: ``sessions`` rows of ``state.db``.
    sessions_read: int = 0
    #: Sessions the store did not have before this run.
    sessions_new: int = 0
    #: Sessions whose messages have no ``sessions`` row in ``state.db``.
    sessions_without_row: int = 0
    #: Sessions known only from spool messages.
    sessions_only_in_spool: int = 0
    #: Companion ``<id>#history`` sessions holding ``active = 0`` rows.
    history_sessions: int = 0

    #: ``state.db`` message rows plus spool transcript messages.
    messages_read: int = 0
    rows_read: int = 0
    #: Rows with ``active = 0``, stored in the ``#history`` sessions.
    inactive_rows: int = 0
    spool_messages_read: int = 0
    messages_inserted: int = 0
    messages_already_present: int = 0
    #: Keys the store holds with different content (changed in the source since an
    #: earlier import): the stored row was kept.
    messages_changed: int = 0
    #: Messages the store refused (e.g. too large): not stored, still in the source.
    messages_rejected: int = 0

    #: Spool files by kind name, and ``unparseable``.
    spool_files: dict[str, int] = Field(default_factory=dict)
    files: list[SpoolFile] = Field(default_factory=list)
    unparseable_files: list[SpoolFile] = Field(default_factory=list)
    #: Inbound user messages (kinds 1 and 2) the agent never processed.
    inbound_messages: int = 0
    #: The JSONL file they were written to, for re-delivery.
    inbound_report: str | None = None

    #: Values that could not be stored in their field (the original is kept aside).
    moved_aside: list[Problem] = Field(default_factory=list)
    changed: list[Problem] = Field(default_factory=list)
    rejected: list[Problem] = Field(default_factory=list)
    #: Spool messages equal to a stored row of their session (stored anyway).
    possible_duplicates: list[Problem] = Field(default_factory=list)
    #: Rows stored as live by an earlier import and archived by Hermes since.
    archived_since_import: list[Problem] = Field(default_factory=list)
    #: Everything else worth knowing (a model_config kept as text, a missing prompt).
    notes: list[Problem] = Field(default_factory=list)

    #: Something was not imported as it is, or differs from what is stored: unparseable
    #: spool files, changed or rejected messages, inbound messages not written out.
    needs_attention: bool = False
    seconds: float = 0.0
