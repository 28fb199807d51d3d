"""Importing: what :mod:`.source` read, mapped by :mod:`.mapping` and keyed by
:mod:`.keys`, written through the public methods of
:class:`~sessionrepo.store.repository.SessionRepository` (no SQL of its own).

See the package docstring (:mod:`sessionrepo.importers.hermes`) for what goes where.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final, Literal

from sessionrepo.errors import InvalidMessage, NotFound, RepoError
from sessionrepo.importers.hermes import mapping
from sessionrepo.importers.hermes import usage as hermes_usage
from sessionrepo.importers.hermes.keys import KeyKind, SessionKeys, fingerprint
from sessionrepo.importers.hermes.mapping import Record
from sessionrepo.importers.hermes.source import (
    KIND_NAMES,
    SPOOL_DIR,
    HermesSource,
    SpoolMessage,
    open_hermes,
)
from sessionrepo.importers.hermes.summary import (
    HermesImportError,
    HermesImportSummary,
    HermesSourceError,
    Problem,
)
from sessionrepo.models import AppendResult, Message
from sessionrepo.models.message import to_utc, utcnow
from sessionrepo.store.repository import SessionRepository

#: ``metadata["hermes"]["profile"]`` of the sessions of a root Hermes home.
DEFAULT_PROFILE: Final = "default"
#: Session fields the usage ledger keeps (the sum of the session's usage records).
_LEDGER_TOTALS: Final = frozenset({"input_tokens", "output_tokens"})
#: Most messages written per transaction.
BATCH_SIZE: Final = 500
_BATCH_INDEX: Final = re.compile(r"^messages\[(\d+)\]")


@dataclasses.dataclass(frozen=True)
class _Replay:
    """What tells whether a row with a uid is a replayed spool message, should appending
    it insert it (see :meth:`.mapping.Replayable.key_of`)."""

    row: Mapping[str, Any]
    content: Any
    by_content: uuid.UUID


@dataclasses.dataclass
class _Entry:
    """One message waiting to be appended: where it came from, what kind of key it has,
    whether it is kept out of the live transcript (``marked``), and, for a row that may
    be a replayed spool message, how to tell."""

    message: Message
    where: str
    kind: KeyKind
    marked: bool = False
    replay: _Replay | None = None


@dataclasses.dataclass
class _Pending:
    """Messages waiting to be appended to one stored session."""

    session_id: str
    entries: list[_Entry] = dataclasses.field(default_factory=list)


class _Rekeyed(Exception):
    """Appending inserted rows that may be replayed spool messages under new uids: the
    transaction is rolled back, they are sorted out, and the batch appended again."""

    def __init__(self, suspects: list[_Entry]) -> None:
        super().__init__(f"{len(suspects)} rows to sort out")
        self.suspects = suspects


class _Importer:
    def __init__(
        self,
        source: HermesSource,
        repository: SessionRepository,
        *,
        batch_size: int,
        progress: Callable[[int], None] | None,
    ) -> None:
        if not 1 <= batch_size <= BATCH_SIZE:
            raise ValueError(f"batch_size must be between 1 and {BATCH_SIZE}")
        self.source = source
        self.repo = repository
        self.batch_size = batch_size
        self.profile = source.profile or DEFAULT_PROFILE
        self._began = utcnow()
        #: Newest timestamp of the messages this import stored, per session.
        self._newest: dict[str, datetime] = {}
        #: Keys of the inbound (kind 1 and 2) messages, to count what was delivered.
        self._inbound_keys: set[uuid.UUID] = set()
        #: Sessions stored before this run, and what they hold from the spool (read lazily).
        self._existed: set[str] = set()
        self._replayable: dict[str, mapping.Replayable] = {}
        self.progress = progress
        spool = source.spool
        self.counts = {
            "sessions_read": 0,
            "sessions_new": 0,
            "sessions_without_row": 0,
            "sessions_only_in_spool": 0,
            "rows_read": 0,
            "inactive_rows": 0,
            "spool_messages_read": 0,
            "messages_inserted": 0,
            "messages_already_present": 0,
            "messages_seen_by_another_route": 0,
            "messages_changed": 0,
            "messages_rejected": len(spool.rejected),
            "inbound_messages": len(spool.inbound),
            "inbound_inserted": 0,
            "usage_rows_read": 0,
            "usage_records_inserted": 0,
        }
        self.set_aside: collections.Counter[str] = collections.Counter()
        self.lists: dict[str, list[Problem]] = {
            "moved_aside": [],
            "changed": [],
            "rejected": list(spool.rejected),
            "inbound_undelivered": list(spool.undelivered),
            "archived_since_import": [],
            "dump_entries_persisted": [
                Problem(
                    where=f"{SPOOL_DIR}/{entry.file} messages[{entry.index}]",
                    session_id=entry.session,
                    problem=(
                        f"already in state.db (message_uid {entry.message_uid}): skipped"
                        if entry.how == "verified"
                        else "marked _db_persisted (no message_uid to check): skipped"
                    ),
                )
                for entry in spool.persisted
            ],
            "possible_duplicates": [],
            "duplicate_rows": [],
            "pending_delegations": self._delegations(),
            "notes": list(spool.notes),
        }
        self.started = time.monotonic()

    def _delegations(self) -> list[Problem]:
        return [
            Problem(
                where=f"state.db async_delegations {row.id_column}={row.id!r}",
                session_id=None
                if row.session is None
                else mapping.session_id_of(row.session, None),
                problem="a delegated task whose result was never delivered to its session"
                + (f" (state {row.state!r})" if row.state is not None else "")
                + ": it is not part of any transcript; Hermes delivers it on its next run",
            )
            for row in self.source.pending_delegations()
        ]

    # -- driving ------------------------------------------------------------------------

    def run(self) -> HermesImportSummary:
        try:
            done: set[Any] = set()
            for row in self.source.sessions():
                self._import_session(row["id"], row, "row")
                done.add(row["id"])
            for raw in self.source.sessions_without_row():
                self._import_session(raw, None, "no-row")
                done.add(raw)
            for raw in sorted(set(self.source.spool.messages) - done):
                self._import_session(raw, None, "spool")
        except (HermesSourceError, HermesImportError):
            raise
        except RepoError as exc:
            raise HermesImportError(
                f"the import stopped after {self.counts['messages_inserted']:,} messages "
                f"inserted ({self.counts['messages_already_present']:,} already stored): "
                f"{exc}; run it again to continue (what is stored is not written twice)",
                self.summary(),
            ) from exc
        return self.summary()

    def summary(self) -> HermesImportSummary:
        source = self.source
        files = source.spool.files
        by_kind: dict[str, int] = {}
        for kind in (*KIND_NAMES.values(), "unparseable"):
            count = sum((item.kind_name or "unparseable") == kind for item in files)
            if count:
                by_kind[kind] = count
        unparseable = [item for item in files if item.kind is None]
        counts = self.counts
        lists = self.lists
        attention = bool(
            unparseable
            or counts["messages_changed"]
            or counts["messages_rejected"]
            or lists["inbound_undelivered"]
        )
        return HermesImportSummary(
            source=str(source.path),
            profile=self.profile,
            state_db=str(source.state_db) if source.state_db else None,
            schema_version=source.schema_version,
            spool_dir=str(source.spool_dir) if source.spool_dir else None,
            spool_not_read=str(source.spool_not_read) if source.spool_not_read else None,
            messages_read=counts["rows_read"] + counts["spool_messages_read"],
            set_aside_rows=dict(sorted(self.set_aside.items())),
            spool_files=by_kind,
            files=files,
            unparseable_files=unparseable,
            needs_attention=attention,
            seconds=round(time.monotonic() - self.started, 3),
            **counts,
            **lists,
        )

    # -- sessions -------------------------------------------------------------------------

    def _import_session(
        self, raw: Any, row: dict[str, Any] | None, origin: Literal["row", "no-row", "spool"]
    ) -> None:
        """Import one session: its ``sessions`` row (if any), its messages, its spool."""
        where = f"state.db sessions.id={raw!r}" if row is not None else f"session {raw!r}"
        record = Record(
            where, None, "metadata.hermes.moved_aside", system_prompt=self.source.system_prompt
        )
        sid = mapping.session_id_of(raw, record)
        record.session_id = sid
        spooled = self.source.spool.messages.get(raw, []) if isinstance(raw, str) else []
        fields: dict[str, Any] = {}
        if row is not None:
            self.counts["sessions_read"] += 1
            fields = mapping.session_fields(row, self.profile, record)
        elif origin == "no-row":
            self.counts["sessions_without_row"] += 1
            self.lists["notes"].append(
                Problem(
                    where=where,
                    session_id=sid,
                    problem="messages without a sessions row in state.db: the session was "
                    "created from its first message",
                )
            )
        else:
            self.counts["sessions_only_in_spool"] += 1
            fields = {"started_at": spooled[0].time}
        if row is None:
            hermes: dict[str, Any] = {"profile": self.profile}
            if record.moved:
                hermes["moved_aside"] = record.moved
            fields["metadata"] = {"hermes": hermes}
        self._collect(record)
        existed = self._exists(sid)
        if existed:
            self._existed.add(sid)
        else:
            self.counts["sessions_new"] += 1
        if origin != "no-row":
            # The token totals follow from the usage records (below), not from the row.
            self.repo.create_session(
                sid, **{k: v for k, v in fields.items() if k not in _LEDGER_TOTALS}
            )
        self._import_messages(raw, sid, fields, existed, spooled, create=origin == "no-row")
        if row is not None:
            self._import_usage(raw, sid, row, fields)

    def _import_usage(
        self, raw: Any, sid: str, row: Mapping[str, Any], fields: Mapping[str, Any]
    ) -> None:
        """The session's ``session_model_usage`` rows (else its ``sessions`` totals) as
        usage records, each total counted once (:mod:`.usage`)."""
        rows = self.source.model_usage(raw)
        self.counts["usage_rows_read"] += len(rows)
        if not rows:
            seeded = hermes_usage.from_session(row)
            rows = [] if seeded is None else [seeded]
        if not rows:
            return
        when = fields.get("ended_at") or fields.get("started_at")
        made, problems = hermes_usage.records(
            raw,
            rows,
            self.repo.list_usage(sid) if sid in self._existed else [],
            session_time=when if isinstance(when, int | float) else None,
        )
        for problem in problems:
            self.lists["notes"].append(
                Problem(where=f"state.db sessions.id={raw!r}", session_id=sid, problem=problem)
            )
        if made:
            recorded = self.repo.record_usage(sid, made)
            self.counts["usage_records_inserted"] += len(recorded.inserted)

    def _exists(self, sid: str) -> bool:
        try:
            self.repo.get_session(sid)
        except NotFound:
            return False
        return True

    def _collect(self, record: Record) -> None:
        """What mapping a record moved aside and noted, into the summary's lists."""
        self.lists["moved_aside"] += record.problems
        self.lists["notes"] += record.notes

    # -- messages -------------------------------------------------------------------------

    def _import_messages(
        self,
        raw: Any,
        sid: str,
        fields: Mapping[str, Any],
        existed: bool,
        spooled: list[SpoolMessage],
        *,
        create: bool,
    ) -> None:
        live = _Pending(sid)
        keys = SessionKeys(raw)
        last_time = fields.get("started_at")
        created = not create
        for row in self.source.messages(raw):
            self.counts["rows_read"] += 1
            built = self._row_message(row, sid, last_time, keys)
            if built is None:
                continue
            entry, state = built
            last_time = entry.message.timestamp
            if not created:
                # Messages without a sessions row: the session starts with its first one.
                self.repo.create_session(sid, **{**fields, "started_at": last_time})
                created = True
            if state is not None:
                self.set_aside[state] += 1
                if row.get("active") in (0, "0"):
                    self.counts["inactive_rows"] += 1
            self._add(live, entry)
        for item in spooled:
            self.counts["spool_messages_read"] += 1
            built_spool = self._spool_message(item, sid, keys)
            if built_spool is None:
                continue
            message, kind = built_spool
            where = mapping.spool_where(item)
            if (
                kind == "content"
                and fingerprint(item.message.get("role"), item.message.get("content"))
                in keys.row_prints
            ):
                self.lists["possible_duplicates"].append(
                    Problem(
                        where=where,
                        session_id=sid,
                        problem="same role and content as a state.db row of this session, "
                        "and no message_uid to tell them apart (a replay that inserted it and "
                        "crashed before deleting the file?): stored",
                    )
                )
            if item.kind in (1, 2):
                self._inbound_keys.add(message.client_msg_uuid)
            self._add(live, _Entry(message, where, kind))
        self._flush(live)
        if not existed:
            self._settle_activity(sid, fields)

    def _replayable_of(self, sid: str) -> mapping.Replayable:
        """What an existing session holds from the spool, read once per run."""
        replayable = self._replayable.get(sid)
        if replayable is None:
            transcript = self.repo.load_transcript(sid, include_retracted=True)
            replayable = self._replayable[sid] = mapping.Replayable(transcript)
        return replayable

    def _settle_activity(self, sid: str, fields: Mapping[str, Any]) -> None:
        """Date a session this import created by its own history: its last activity is
        its newest message (or its end), not the moment of the import, so that listings
        keep the Hermes gateway's order. It replaces the stamp this import's appends set
        (the import's own time), or moves an older one forward."""
        known = [when for when in [self._newest.pop(sid, None)] if when is not None]
        for name in ("started_at", "ended_at"):
            if fields.get(name) is not None:
                known.append(to_utc(fields[name], name))  # a spool file's time is epoch
        if not known:
            return
        self.repo.backdate_activity(sid, max(known), stamped_since=self._began)

    def _row_message(
        self, row: dict[str, Any], sid: str, last_time: Any, keys: SessionKeys
    ) -> tuple[_Entry, str | None] | None:
        """A row's entry and its state; ``None`` when it is not stored (a second live row
        of one uid, or one the model refuses)."""
        where = f"state.db messages.id={row['id']}"
        record = Record(where, sid, "extra.hermes.moved_aside")
        decoded = mapping.row_content(row, record)
        state = mapping.row_state(row)
        role = row.get("role")
        uid = row.get("message_uid")
        key, kind, by_content = keys.for_row(uid, role, decoded[0], live=state is None)
        if kind == "duplicate":
            self.lists["notes"] += record.notes
            self.lists["duplicate_rows"].append(
                Problem(
                    where=where,
                    session_id=sid,
                    field="message_uid",
                    problem=f"a second live row of message_uid {row.get('message_uid')!r} "
                    "(Hermes stored the message twice): kept once",
                )
            )
            self._processed(1)
            return None
        values = mapping.row_message(row, record, key=key, decoded=decoded, last_time=last_time)
        message = self._message(values, record)
        if message is None:
            return None
        # Only a session stored before this run can hold the spool message a row is.
        replay = _Replay(row, decoded[0], by_content) if kind == "uid" else None
        entry = _Entry(
            message,
            where,
            kind,
            marked=state is not None,
            replay=replay if sid in self._existed else None,
        )
        return entry, state

    def _spool_message(
        self, item: SpoolMessage, sid: str, keys: SessionKeys
    ) -> tuple[Message, KeyKind] | None:
        record, provenance_key = mapping.spool_record(item, sid)
        key, kind = keys.for_spool(
            item.message.get("message_uid"), item.message.get("role"), item.message.get("content")
        )
        values = mapping.spool_message(item, record, provenance_key, key=key)
        message = self._message(values, record)
        return None if message is None else (message, kind)

    def _message(self, values: Mapping[str, Any], record: Record) -> Message | None:
        self._collect(record)
        built = mapping.build_message(values, record)
        if isinstance(built, Message):
            return built
        self.counts["messages_rejected"] += 1
        self.lists["rejected"].append(built)
        self._processed(1)
        return None

    def _processed(self, count: int) -> None:
        if self.progress is not None and count:
            self.progress(count)

    # -- writing --------------------------------------------------------------------------

    def _add(self, pending: _Pending, entry: _Entry) -> None:
        pending.entries.append(entry)
        if len(pending.entries) >= self.batch_size:
            self._flush(pending)

    def _flush(self, pending: _Pending) -> None:
        """Append what is pending (:meth:`_write`); a message the store rejects is
        reported and the rest of the batch appended."""
        sid = pending.session_id
        entries, pending.entries = pending.entries, []
        total = len(entries)
        while entries:
            try:
                result, taken_out = self._write(sid, entries)
            except InvalidMessage as exc:
                match = _BATCH_INDEX.match(exc.field)
                if match is None:
                    raise
                index = int(match.group(1))
                self.counts["messages_rejected"] += 1
                self.lists["rejected"].append(
                    Problem(
                        where=entries[index].where,
                        session_id=sid,
                        field=exc.field.partition(".")[2] or None,
                        problem=f"{exc.reason}: not stored; it stays in the source",
                    )
                )
                del entries[index]
                continue
            self._written(sid, entries, result, taken_out)
            break
        self._processed(total)

    def _write(self, sid: str, entries: list[_Entry]) -> tuple[AppendResult, list[uuid.UUID]]:
        """Append a batch in one unit of work of its session, and take its rows that are
        not conversation out of the live transcript in the same transaction.

        The one place that decides where such rows go: appended to their own session in
        ``id`` order with the other rows (so its ``seq`` is where Hermes had it), then
        retracted: never live, not even for a moment. Retracted, not ``compacted``: the
        store marks ``compacted`` only by its own ``compact``, which writes a summary;
        Hermes' state (``archived``, ``rewound``, ``session_meta``, ``hidden``) is in
        ``extra["hermes"]["state"]``. A row stored live by an earlier import is taken
        out now too (the keys taken out are returned).

        A row with a uid that the append inserted may be a spool message an earlier import
        stored, which a Hermes restart replayed under a new uid: then the transaction is
        rolled back and the batch appended again, the row under the stored key. What the
        session holds from the spool is read at most once per run, outside a transaction.
        """
        try:
            return self._attempt(sid, entries)
        except _Rekeyed as rolled_back:
            self._resolve(sid, rolled_back.suspects)
        return self._attempt(sid, entries)  # every row that could be a replay sorted out

    def _attempt(self, sid: str, entries: list[_Entry]) -> tuple[AppendResult, list[uuid.UUID]]:
        with self.repo.session_transaction(sid, create=False) as tx:
            result = tx.append([entry.message for entry in entries])
            inserted = set(result.inserted)
            suspects = []
            for entry in entries:
                if entry.replay is None:
                    continue
                if entry.message.client_msg_uuid in inserted:
                    suspects.append(entry)
                else:
                    entry.replay = None  # stored before under its own key: no replay
            if suspects:
                if sid in self._replayable and not self._resolve(sid, suspects):
                    suspects = []  # none was a replay: what was appended stands
                if suspects:
                    raise _Rekeyed(suspects)  # rolls back; appended again
            marked = [entry.message.client_msg_uuid for entry in entries if entry.marked]
            return result, tx.supersede(marked) if marked else []

    def _resolve(self, sid: str, suspects: list[_Entry]) -> bool:
        """Give each suspect that is a replayed spool message its stored key; whether one
        was. What the session holds from the spool is read on the first call."""
        replayable = self._replayable_of(sid)
        rekeyed = False
        for entry in suspects:
            replay, entry.replay = entry.replay, None
            if replay is None:
                continue  # sorted out already
            stored = replayable.key_of(
                replay.row, replay.content, entry.message.client_msg_uuid, replay.by_content
            )
            if stored is not None:
                entry.message = entry.message.model_copy(update={"client_msg_uuid": stored})
                entry.kind = "replayed"
                rekeyed = True
        return rekeyed

    def _written(
        self,
        sid: str,
        entries: list[_Entry],
        result: AppendResult,
        taken_out: list[uuid.UUID],
    ) -> None:
        """Count what a committed batch did, and sort out its conflicts."""
        by_key = {entry.message.client_msg_uuid: entry for entry in entries}
        for key in result.inserted:
            if key in self._inbound_keys:
                self.counts["inbound_inserted"] += 1
        if result.inserted:
            newest = max(entry.message.timestamp for entry in entries)
            known = self._newest.get(sid)
            self._newest[sid] = newest if known is None else max(known, newest)
        self.counts["messages_inserted"] += len(result.inserted)
        self.counts["messages_already_present"] += len(result.duplicates)
        self._sort_out_conflicts(sid, result.conflicts, by_key)
        inserted = set(result.inserted)
        for key in taken_out:
            if key not in inserted:
                self.lists["archived_since_import"].append(
                    Problem(
                        where=by_key[key].where,
                        session_id=sid,
                        field="active",
                        problem="stored as live by an earlier import, taken out of the "
                        "conversation by Hermes since: retracted now (kept, with its state "
                        "in extra.hermes.state)",
                    )
                )

    def _sort_out_conflicts(
        self,
        sid: str,
        conflicts: list[uuid.UUID],
        by_key: Mapping[uuid.UUID, _Entry],
    ) -> None:
        """A key stored with other content is the same message read by another route
        (already present), or a message Hermes changed since (listed)."""
        if not conflicts:
            return
        stored = {
            m.client_msg_uuid: m for m in self.repo.load_transcript(sid, include_retracted=True)
        }
        for key in conflicts:
            message, where, kind = by_key[key].message, by_key[key].where, by_key[key].kind
            earlier = stored.get(key)
            if earlier is not None and mapping.same_message(message, earlier, kind):
                self.counts["messages_already_present"] += 1
                self.counts["messages_seen_by_another_route"] += 1
                continue
            if earlier is not None and mapping.same_but_state(message, earlier):
                # Taken out of (or back into) the conversation by Hermes since: the
                # stored row is the same message; _write has retracted it.
                self.counts["messages_already_present"] += 1
                continue
            self.counts["messages_changed"] += 1
            self.lists["changed"].append(
                Problem(
                    where=where,
                    session_id=sid,
                    problem=f"stored earlier (key {key}) with different content: the "
                    "source changed since; the stored message was kept",
                )
            )


def import_hermes(
    source: HermesSource | str | os.PathLike[str],
    repository: SessionRepository,
    *,
    progress: Callable[[int], None] | None = None,
    batch_size: int = BATCH_SIZE,
) -> HermesImportSummary:
    """Import one Hermes home (or ``state.db``) into ``repository``; see the module
    docstring. A home's named profiles are homes of their own (:func:`hermes_profiles`).

    Safe to run again, and after a Hermes restart: what is stored is not written twice.

    Args:
        source: an open :class:`HermesSource` (left open), or a path to open (and close).
        repository: the store to write to.
        progress: called with the number of messages just processed (a progress bar's
            ``update``); the calls add up to ``source.total_messages``.
        batch_size: messages per transaction, at most 500.

    Raises:
        HermesSourceError: the source cannot be read.
        HermesImportError: the store failed part-way (``.summary`` says how far it got).
    """
    opened = source if isinstance(source, HermesSource) else open_hermes(source)
    try:
        return _Importer(opened, repository, batch_size=batch_size, progress=progress).run()
    finally:
        if opened is not source:
            opened.close()
