"""Import a Hermes gateway's history: its ``state.db`` and its ``pending_messages/`` spool.

The formats are described in ``hermes-state-format.md``. :mod:`.source` reads them,
:mod:`.mapping` turns what it read into session fields and messages (one table of field
rules per kind), :mod:`.keys` keys each message, :mod:`.importing` writes them through
the public methods of :class:`~sessionrepo.store.repository.SessionRepository` (no SQL of
its own), and :mod:`.summary` holds what an import reports. This package only re-exports
their public names. What the importer decides, and why:

**The source is never modified.** ``state.db`` is not opened where it lies: SQLite writes
into the ``-shm`` file of a WAL database even on a read-only connection, creates
``-wal``/``-shm`` when they are missing, and an ``immutable`` open would miss the WAL tail
of a killed gateway. :mod:`.source` copies ``state.db`` and its ``-wal`` (or ``-journal``)
into a private temporary directory, again when a file changed while it was copied, and
reads the copy (SQLite rebuilds the ``-shm`` index there). So the gateway's home stays
byte-for-byte the same, whether a gateway is running, was killed, or stopped cleanly; the
import sees one consistent snapshot. Nothing under the Hermes home is written, renamed or
deleted, spool files included. Text is decoded with ``surrogateescape``, so a row holding
invalid UTF-8 is imported (and reported) instead of aborting the import.

**Schema versions.** Columns are found with ``PRAGMA table_info``; whatever exists is read
(version 2 to 31 and later), nothing is assumed beyond ``sessions.id``, ``messages.id``,
``messages.session_id`` and ``messages.role``. ``messages_fts`` and other tables are
ignored, except ``system_prompts`` (the prompt a session's ``system_prompt_hash`` names),
``gateway_routing`` (where inbound messages go) and ``async_delegations`` (results never
delivered are reported, by ``delegation_id`` and ``origin_session``, or ``id`` and
``session_id`` before version 31).

**Profiles.** A named profile (``profiles/<name>/``) is a Hermes home of its own; the CLI
imports the root home and every profile (:func:`hermes_profiles`), and each session's
``metadata["hermes"]["profile"]`` names its profile (``"default"`` for the root home).

**Sessions.** Each Hermes session becomes a session with the same id. Mapped to fields:
``source``, ``user_id``, ``title``, ``model``, ``model_settings`` (Hermes'
``model_config``, JSON text parsed to a dict), ``system_prompt`` (or the prompt
``system_prompt_hash`` names), ``parent_session_id``, ``started_at`` / ``ended_at``,
``end_reason``, ``input_tokens`` / ``output_tokens``. Every other non-NULL column goes to
``metadata["hermes"]`` under its column name (:data:`.mapping.SESSION_RULES`).

**Messages.** Rows are read in ``id`` order (Hermes' transcript order). Mapped to fields:
``role``, ``content`` (the ``"\\x00json:"`` form becomes the JSON content parts it
encodes), ``tool_calls``, ``tool_call_id``, ``tool_name``, ``reasoning``,
``finish_reason``, ``token_count``, ``timestamp``, ``platform_message_id``. Every other
non-NULL column goes to ``extra["hermes"]`` under its column name
(:data:`.mapping.MESSAGE_RULES`), plus the row's ``id``
and exact ``timestamp`` REAL. JSON-valued columns are kept as the text Hermes stored; a
BLOB (``display_identity``) as ``{"base64": "<its bytes>"}``, which gives the bytes back
exactly. ``extra["hermes"]`` is import provenance: drop it before sending a loaded
transcript to a provider.

**Rows that are not conversation** are kept, out of the live transcript, the way Hermes
keeps them out of the model's history: ``active = 0`` (``archived`` by compaction, or
``rewound``), ``display_kind = 'hidden'`` and ``role = 'session_meta'`` bookkeeping rows
(stored with role ``system``, the Hermes role in ``extra["hermes"]["role"]``). Each has its
state in ``extra["hermes"]["state"]``. They are stored in their own session, in ``id``
order with the other rows (each ``seq`` where Hermes had it), and retracted there
(``superseded == "retracted"``; the store's ``compacted`` state is only set by its own
``compact``, which writes a summary, so an archived row is retracted too and says
``archived`` in its state): :meth:`.importing._Importer._write` is the one place that
decides it. So ``load_transcript(id)`` is the conversation Hermes' own reader presents,
``load_transcript(id, include_retracted=True)`` every row, and ``search`` finds none of
these. A row an earlier import stored live that Hermes took out of the conversation since
is retracted by the next import (listed in ``archived_since_import``).

**Keys: one per logical message, whatever route it took.** A message can be read as a
``state.db`` row, as a kind-3 payload (and, after a Hermes restart replayed it, as a row),
or in a kind-4 dump. Keys never depend on a path or a row ``id``:

- a message with a ``message_uid`` gets :func:`uid_key` (a gateway that knows the uid can
  compute it), by whichever route it comes. Copies a compaction made (a later row of the
  same session with the same uid) get :func:`copy_key` of the uid and their rank among the
  copies: distinct rows, and stable (compaction only adds rows). A later *live* row of a
  uid whose earlier row is live too is not a copy but the message stored twice (Hermes'
  spool replay is not idempotent): it is kept once and listed.
- a message without a uid gets :func:`content_key`: its session, role, content and how many
  messages of that session with the same role and content come before it (rows in ``id``
  order, then the spool in the order a Hermes restart replays it). A restart appends the
  replayed messages after the rows in that same order, so each keeps its key.
- a row a Hermes restart replayed from a payload (kinds 1 to 3) that an earlier import
  stored keeps the key that message was stored under, whatever uid the row has: a version
  31 gateway mints a fresh uid for each replayed message without one, and a
  ``client_msg_uuid`` the dict carried has no column in ``state.db``. Such a row is
  recognised, when appending inserted it into a session stored before this run (the batch
  is then rolled back and appended again; what the session holds from the spool is read
  once per run, and only then), by the uid the
  payload carried, else by its place (its content key, as above) or, for a message
  stored under its dict's own key, by its role and content, and in both cases by its
  time (the payload's ``ts``, or the message's own) (:class:`.mapping.Replayable`).

The same message read by another route is *already present*, not a conflict: when the key
is stored with other provenance (a spool payload then, a row now) and the same role and
content (for a content key, the same timestamp too), it is counted as already present.

**The spool** is read, never changed; unparseable or unrecognised files are reported and
stay where they are. Files are read as ``utf-8-sig`` (a BOM is fine); ``.json.bad`` files
(a payload the gateway's database refused) are payloads; ``.pending-*.tmp`` files are
half-written and noted, not read.

- Kinds 1 and 2 (inbound user text the agent never processed) become ``user`` messages,
  ``timestamp = ts``, of the session Hermes would append them to: ``data.session_id``, else
  the session ``session_key`` routes to (``gateway_routing``, else the newest session with
  that ``session_key``), followed to the live tip of its compression chain. One that no
  session can be found for is listed (it needs a person) and stays in the spool.
- Kind 3 (transcript cap drop) is stored in its session with every key of the dict
  (``tool_calls``, ``tool_call_id``, ``reasoning``, ``message_uid`` and unknown keys alike).
  Its timestamp is the dict's own ``"timestamp"``, else the payload's ``ts``.
- Kinds 1 to 3 join their session after its rows in Hermes' replay order
  ``(ts, seq, file name)``; provenance in ``extra["hermes"]`` (file, kind, reason, ts, seq).
- Kind 4 (agent-history dump) holds the agent's whole conversation: an entry whose
  ``message_uid`` ``state.db`` holds, or that says ``_db_persisted`` without a uid, is
  skipped and counted as already persisted; the rest are stored after the replayed kinds
  (Hermes never replays kind 4), dated by their own ``"timestamp"``, else the file's time.

**Values that cannot be stored faithfully** (a lone surrogate, invalid UTF-8, a control
character in an id, NaN, JSON that does not parse) never abort the import. The field gets
the nearest storable value and the original goes, as its ``repr()``, to
``extra["hermes"]["moved_aside"][field]`` (``metadata["hermes"]["moved_aside"]`` for
sessions); the summary lists each one.

**Writes** go straight to the primary, in batches of at most 500 messages, each batch one
unit of work of its session (``SessionRepository.session_transaction``): its messages
appended and its rows that are not conversation retracted in one transaction, so no such
row is ever live, not even between two batches. A database failure stops the import with
an error that says how far it got; running it again continues. A message the store
rejects for its size is reported and the rest of its batch is stored. Only public names of
``sessionrepo`` are used.

**Running it again** on an unchanged source inserts nothing, and neither does a run after a
Hermes restart replayed the spool into ``state.db``. A row Hermes changed in place since an
earlier import has the same key and different content: the stored row is kept
(append-only) and listed; a row archived since an earlier import is listed too.
"""

from sessionrepo.importers.hermes.importing import BATCH_SIZE, DEFAULT_PROFILE, import_hermes
from sessionrepo.importers.hermes.keys import NAMESPACE, content_key, copy_key, uid_key
from sessionrepo.importers.hermes.mapping import JSON_CONTENT_MARK, row_state
from sessionrepo.importers.hermes.source import (
    KIND_NAMES,
    PROFILES_DIR,
    SPOOL_DIR,
    STATE_DB,
    HermesSource,
    hermes_profiles,
    open_hermes,
)
from sessionrepo.importers.hermes.summary import (
    HermesImportError,
    HermesImportReport,
    HermesImportSummary,
    HermesSourceError,
    Problem,
    SpoolFile,
)

__all__ = [
    "BATCH_SIZE",
    "DEFAULT_PROFILE",
    "JSON_CONTENT_MARK",
    "KIND_NAMES",
    "NAMESPACE",
    "PROFILES_DIR",
    "SPOOL_DIR",
    "STATE_DB",
    "HermesImportError",
    "HermesImportReport",
    "HermesImportSummary",
    "HermesSource",
    "HermesSourceError",
    "Problem",
    "SpoolFile",
    "content_key",
    "copy_key",
    "hermes_profiles",
    "import_hermes",
    "open_hermes",
    "row_state",
    "uid_key",
]
