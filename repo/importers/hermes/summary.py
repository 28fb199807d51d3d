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
    #: A ``.json.bad`` file: a payload the gateway's own database refused.
    refused_by_gateway_db: bool = False


class HermesImportSummary(BaseModel):
    """What one :func:`import_hermes` run read, stored, and set aside."""

    model_config = ConfigDict(frozen=True)

    source: str
    #: The Hermes profile (``profiles/<name>/``); ``"default"`` for the root home.
    profile: str | None = None
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

    #: ``state.db`` message rows plus spool transcript messages.
    messages_read: int = 0
    rows_read: int = 0
    #: Rows with ``active = 0`` (stored in their session, retracted).
    inactive_rows: int = 0
    #: Rows kept out of the live transcript, by why: ``archived``, ``rewound``,
    #: ``hidden``, ``session_meta``.
    set_aside_rows: dict[str, int] = Field(default_factory=dict)
    spool_messages_read: int = 0
    messages_inserted: int = 0
    messages_already_present: int = 0
    #: Of those, stored earlier from another route (a spool payload then, a row now).
    messages_seen_by_another_route: int = 0
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
    #: Of those, appended to their session by this run (the rest were already there).
    inbound_inserted: int = 0
    #: ``session_model_usage`` rows read (a session without any: its ``sessions`` totals).
    usage_rows_read: int = 0
    #: Usage records this run added: what Hermes counted since the last import, once.
    usage_records_inserted: int = 0
    #: Inbound messages no session could be found for (they stay in the spool).
    inbound_undelivered: list[Problem] = Field(default_factory=list)
    #: Kind-4 entries ``state.db`` already holds: skipped.
    dump_entries_persisted: list[Problem] = Field(default_factory=list)
    #: ``async_delegations`` results never delivered to their session.
    pending_delegations: list[Problem] = Field(default_factory=list)

    #: Values that could not be stored in their field (the original is kept aside).
    moved_aside: list[Problem] = Field(default_factory=list)
    changed: list[Problem] = Field(default_factory=list)
    rejected: list[Problem] = Field(default_factory=list)
    #: Spool messages without a uid equal to a row of their session (stored anyway).
    possible_duplicates: list[Problem] = Field(default_factory=list)
    #: Rows Hermes stored twice (a second live row of one ``message_uid``): kept once.
    duplicate_rows: list[Problem] = Field(default_factory=list)
    #: Rows stored as live by an earlier import and taken out of the conversation by
    #: Hermes since: retracted by this run.
    archived_since_import: list[Problem] = Field(default_factory=list)
    #: Everything else worth knowing (a model_config kept as text, a missing prompt).
    notes: list[Problem] = Field(default_factory=list)

    #: Something needs a person: unparseable spool files, changed or rejected messages,
    #: inbound messages no session takes.
    needs_attention: bool = False
    seconds: float = 0.0


class HermesImportReport(BaseModel):
    """What one ``import-hermes`` run did: one summary per home (the root, then each
    profile), and the profiles it did not import."""

    model_config = ConfigDict(frozen=True)

    homes: list[HermesImportSummary] = Field(default_factory=list)
    #: ``(profile, command)`` of each profile not imported (``--no-profiles``).
    profiles_not_imported: list[tuple[str, str]] = Field(default_factory=list)
    #: Session ids found in more than one home (their messages share one session).
    shared_session_ids: list[str] = Field(default_factory=list)

    @property
    def needs_attention(self) -> bool:
        return bool(self.shared_session_ids) or any(h.needs_attention for h in self.homes)
