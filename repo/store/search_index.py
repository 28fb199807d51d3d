"""Full-text search over message content, the same on SQLite and PostgreSQL.

The index (FTS5 on SQLite, a ``tsvector`` table with a GIN index on PostgreSQL; the SQL
lives in ``repo/_dialects.py``) is kept *beside* the transcript, never inside its write.
An append records what it inserted in ``search_backlog`` (one row, in its own
transaction: a committed message is always either indexed or named there), and
:meth:`SearchIndex.catch_up` indexes the backlog later, in transactions of its own that
index a batch of rows and delete them. Indexing costs several times what storing a
message does (an FTS5 segment, GIN maintenance); batched, off the append, it costs the
writer nothing and costs less in all. ``search`` catches up first, so its answers
include every message committed before it was called; a ``TranscriptWriter``'s drainer
catches up every round, so the backlog stays small. With ``search_index="immediate"``,
an append indexes its messages itself, in a savepoint of its own transaction.

Whatever goes wrong while indexing (a corrupt FTS5 file, a missing table, an oversized
document) rolls back the indexing only, marks the index ``stale`` in
``search_index_state``, and the append (or the catch-up's removal of its rows) still
commits. A stale index refuses to answer (``SearchIndexUnavailable``) until ``reindex``
rebuilds it from the messages, emptying the backlog in the same transaction.

The text is prepared in Python, identically for both backends: content parts are reduced
to their text, the first ``INDEX_CHARS`` characters are kept, case is folded, Latin and
Cyrillic diacritics are dropped, and every CJK character, emoji or other symbol becomes a
word of its own (symbols as ``u`` + hex code point), so both tokenizers see the same words.

User queries are words, "quoted phrases", ``prefix*`` and ``-excluded``; anything else is
literal text. Nothing a user types reaches SQL except as a bound parameter.

What a query costs does not grow with how common its words are. ``order="newest"`` walks
the index from the newest message (SQLite: the FTS5 rowid is derived from the message
time; PostgreSQL: a b-tree on the time, or the GIN index for a rare query, chosen by a
probe) and stops after a page. ``order="rank"`` orders by relevance the newest
``RANK_WINDOW`` matches only (see there), and every hit is checked against the message
text, which also yields its snippet: an index that names a message not saying what was
asked raises ``SearchIndexUnavailable`` instead of answering wrongly.
"""

from __future__ import annotations

import contextlib
import re
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from sqlalchemy import Connection, bindparam, delete, exists, func, select, tuple_
from sqlalchemy import exc as sa_exc

from sessionrepo.errors import BackendUnavailable, InvalidMessage, RepoError, SearchIndexUnavailable
from sessionrepo.models.message import utcnow
from sessionrepo.models.search import SearchHit
from sessionrepo.models.tables import (
    decode_text,
    messages_table,
    search_backlog_table,
    search_state_table,
)
from sessionrepo.store.database import Database

#: Characters of each message that are indexed (a 20 MB tool output is findable by its
#: beginning; the rest is stored, not indexed).
INDEX_CHARS: Final = 100_000
#: Longest query accepted, in characters.
MAX_QUERY_CHARS: Final = 10_000
#: Most terms a query may have (the rest are ignored).
MAX_TERMS: Final = 32
SNIPPET_CHARS: Final = 160
#: ``order="rank"`` orders by relevance the newest ``RANK_WINDOW`` messages that match
#: (after the filters), not every match: a word found in most of a million messages
#: would otherwise cost seconds to rank, and in a chat history the best matches among
#: the recent ones are what is looked for. Pages past the window are empty; older
#: matches are reached with ``order="newest"`` or ``until=``.
RANK_WINDOW: Final = 200

#: Backlog rows one catch-up transaction takes, and the messages it stops adding rows
#: at: a transaction holds SQLite's write lock (appends wait) for a bounded time.
CATCH_UP_ROWS: Final = 200
CATCH_UP_MESSAGES: Final = 2000

_INDEX_NAME: Final = "messages"
M = messages_table.c
ST = search_state_table.c
B = search_backlog_table.c

# CJK ideographs, kana, Hangul and their compatibility forms: one character, one word.
_CJK = (
    "\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u31a0-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uffdc"
    "\U00020000-\U0003134f"
)
_CJK_CHAR = re.compile(f"[{_CJK}]")
#: Combining diacritical marks (the block Latin, Greek and Cyrillic letters take; kana
#: voicing marks and other scripts' marks are elsewhere and stay).
_LATIN_MARKS = re.compile("[\u0300-\u036f]+")
#: A word, for the index and for queries: letters and digits only, so that SQLite's
#: unicode61 tokenizer and PostgreSQL's parser (which would keep "3.14", "a-b" or an
#: e-mail address whole) see exactly the same words.
_WORD = re.compile(r"[^\W_]+")


def normalize(text: str) -> str:
    """The text as both backends' tokenizers are given it (see the module docstring)."""
    if text.isascii():  # the common case: nothing to decompose, segment or translate
        return text.lower()
    text = unicodedata.normalize("NFKD", text.casefold())
    text = _LATIN_MARKS.sub("", text)
    text = unicodedata.normalize("NFC", text)
    text = _CJK_CHAR.sub(r" \g<0> ", text)
    return _NOT_WORD.sub(_symbol_or_mark, text)


#: Non-ASCII characters that are not letters, digits or spaces: symbols (emoji) become
#: words, marks and format characters vanish. ASCII punctuation and symbols separate.
_NOT_WORD = re.compile(r"[^\w\s\x00-\x7f]")


def _symbol_or_mark(match: re.Match[str]) -> str:
    char = match.group()
    category = unicodedata.category(char)
    if category in ("So", "Sk", "Sm", "Sc"):
        return f" u{ord(char):x} "
    if category in ("Mn", "Me", "Cf"):
        return ""  # variation selectors, ZWJ, stray marks: not part of any word
    return char


def content_text(content: Any) -> str:
    """The searchable text of a message's content: the string, or the text of its parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    _collect_text(content, texts)
    return "\n".join(texts)


def _collect_text(value: Any, texts: list[str]) -> None:
    if isinstance(value, dict):
        text = value.get("text")
        if isinstance(text, str):
            texts.append(text)
        for key, item in value.items():
            if key != "text" and isinstance(item, dict | list):
                _collect_text(item, texts)
    elif isinstance(value, list):
        for item in value:
            _collect_text(item, texts)


def document(content: Any) -> str:
    """What is indexed for a message with this (decoded) content: its words, space apart.

    ASCII text (most of it) is folded in one byte-level pass; in other text only the
    whitespace-separated chunks that hold a non-ASCII character take the Unicode path of
    :func:`normalize` (the words are the same as normalising the whole text: no step of it
    crosses whitespace).
    """
    text = content_text(content)[:INDEX_CHARS]
    if text.isascii():
        return _ascii_words(text)
    pieces: list[str] = []
    last = 0
    for match in _NON_ASCII_CHUNK.finditer(text):
        pieces.append(_ascii_words(text[last : match.start()]))
        pieces.append(" ".join(_WORD.findall(normalize(match.group()))))
        last = match.end()
    pieces.append(_ascii_words(text[last:]))
    return " ".join(pieces)


#: ASCII letters folded to lower case, digits kept, every other byte a separator.
_ASCII_FOLD = (
    bytes(
        (code | 0x20) if chr(code).isalpha() else code if chr(code).isdigit() else 0x20
        for code in range(128)
    )
    + b" " * 128
)
#: A whitespace-separated chunk holding a non-ASCII character (the lookbehind anchors
#: it at the chunk's start, so a long ASCII run is scanned once, not once per position),
#: or a lone non-ASCII space.
_NON_ASCII_CHUNK = re.compile(r"(?<!\S)\S*?[^\x00-\x7f]\S*|[^\x00-\x7f]")


def _ascii_words(text: str) -> str:
    return text.encode("ascii").translate(_ASCII_FOLD).decode("ascii")


# -- queries -------------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """One query term: a word or phrase (``words``), matched as a prefix or excluded."""

    words: tuple[str, ...]
    prefix: bool = False
    excluded: bool = False


@dataclass(frozen=True)
class Query:
    terms: tuple[Term, ...] = field(default_factory=tuple)

    @property
    def positive(self) -> tuple[Term, ...]:
        return tuple(term for term in self.terms if not term.excluded)

    @property
    def negative(self) -> tuple[Term, ...]:
        return tuple(term for term in self.terms if term.excluded)


_TOKEN = re.compile(r'(-?)"([^"]*)"?|(-?)(\S+)')


def parse_query(text: str) -> Query:
    """Words, "phrases", ``prefix*`` and ``-excluded``; everything else is literal text
    (operators such as ``AND``, ``NEAR(`` or ``col:x`` are just words)."""
    if len(text) > MAX_QUERY_CHARS:
        text = text[:MAX_QUERY_CHARS]
    terms: list[Term] = []
    for match in _TOKEN.finditer(text):
        quoted_minus, phrase, minus, bare = match.groups()
        if phrase is not None:
            words = tuple(_WORD.findall(normalize(phrase)))
            if words:
                terms.append(Term(words, excluded=bool(quoted_minus)))
            continue
        excluded = bool(minus) and len(bare) > 1
        prefix = bare.endswith("*")
        words = tuple(_WORD.findall(normalize(bare)))
        if not words:
            continue
        # "a_b", "x-y" or a CJK run: the words must come together, as a phrase.
        terms.append(Term(words, prefix=prefix and len(words) == 1, excluded=excluded))
    return Query(tuple(terms[:MAX_TERMS]))


# -- index maintenance ---------------------------------------------------------------


class SearchIndex:
    """Index maintenance and queries for one database."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.dialect = database.dialect

    def index_in_transaction(
        self, conn: Connection, session_id: str, first_seq: int, contents: Sequence[Any]
    ) -> None:
        """Index messages just inserted in ``conn``'s transaction, inside a savepoint:
        if indexing fails, only the savepoint is rolled back, the index is marked stale
        in the same transaction, and the messages still commit.

        Raises:
            sqlalchemy.exc.DBAPIError: the failure took the whole transaction with it
                (SQLite rolls back by itself on I/O errors or a full disk); then the
                append fails as a whole and is retried or parked like any other.
        """
        if not contents:
            return
        seqs = list(range(first_seq, first_seq + len(contents)))
        documents = [document(content) for content in contents]
        try:
            with conn.begin_nested():
                indexed = self.dialect.index_documents(conn, session_id, seqs, documents)
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated or not self.dialect.transaction_alive(conn):
                raise
            reason = f"indexing session {session_id!r} seq {seqs[0]}..{seqs[-1]} failed: {exc.orig}"
            self._set_state(conn, "stale", reason)
            return
        if indexed != len(seqs):  # messages not found where the caller said they were
            reason = (
                f"indexing session {session_id!r} seq {seqs[0]}..{seqs[-1]}: "
                f"{indexed} of {len(seqs)} messages found"
            )
            self._set_state(conn, "stale", reason)

    def enqueue_in(self, conn: Connection, session_id: str, first_seq: int, count: int) -> None:
        """Name ``count`` messages just inserted in ``conn``'s transaction (``seq``
        ``first_seq`` onwards) for the catch-up: committed with them, or not at all."""
        conn.execute(
            search_backlog_table.insert().values(
                session_id=session_id, first_seq=first_seq, count=count
            )
        )

    def backlog(self) -> int:
        """Messages appended and not indexed yet."""
        return int(
            self.database.read(
                lambda conn: conn.execute(select(func.coalesce(func.sum(B.count), 0))).scalar_one()
            )
        )

    def catch_up(self, limit: int | None = None, *, wait: bool = False) -> int:
        """Index the backlog, in transactions of up to ``CATCH_UP_ROWS`` rows (and about
        ``CATCH_UP_MESSAGES`` messages) that each index their rows' messages and delete
        the rows; returns how many messages were indexed.

        Concurrent catch-ups never index the same rows: on PostgreSQL they skip rows
        another holds (``FOR UPDATE SKIP LOCKED``), on SQLite the write lock serialises
        them. With ``wait``, the call does the rows that were in the backlog when it began
        (rows another catch-up holds are waited for instead of skipped), so that on return
        every message committed before the call is indexed (or the index is stale): what
        ``search`` needs, without chasing appends that keep coming. A failure to index
        marks the index stale and still deletes the rows (``reindex`` indexes every
        message; until then search refuses); appends are never affected. While the index
        is stale, rows are deleted without indexing, for the same reason.

        Args:
            limit: stop after the transaction that reaches this many messages
                (``None``: until the backlog is empty, or with ``wait`` until the rows
                of the call's start are done).

        Raises:
            RepoError: the database failed the transaction as a whole (it is rolled
                back; the rows stay for the next catch-up).
        """
        if not self.database.read(_backlog_exists):
            return 0  # the common case, without the write lock
        # With ``wait``: the rows of this moment, a slice at a time; each slice is done
        # when taking from it finds nothing (its rows indexed, here or by another).
        slices: list[list[tuple[str, int]] | None] = [None]
        if wait:
            keys = self.database.read(_backlog_keys)
            slices = [keys[i : i + CATCH_UP_ROWS] for i in range(0, len(keys), CATCH_UP_ROWS)]
        indexed = done = 0
        for among in slices:

            def batch(
                conn: Connection, among: list[tuple[str, int]] | None = among
            ) -> tuple[int, int]:
                return self._catch_up_batch(conn, wait, among)

            while limit is None or done < limit:
                taken, count = self.database.write(batch)
                if not taken:
                    break
                done += taken
                indexed += count
        return indexed

    def _catch_up_batch(
        self, conn: Connection, wait: bool, among: list[tuple[str, int]] | None
    ) -> tuple[int, int]:
        """One catch-up transaction: (messages taken off the backlog, messages indexed)."""
        rows = self.dialect.take_search_backlog(conn, CATCH_UP_ROWS, wait=wait, among=among)
        chosen: list[Any] = []
        total = 0
        for row in rows:
            if chosen and total + row.messages > CATCH_UP_MESSAGES:
                break  # the rest stay for the next transaction (locks end at commit)
            chosen.append(row)
            total += row.messages
        if not chosen:
            return 0, 0
        conn.execute(
            delete(search_backlog_table).where(
                B.session_id == bindparam("sid"), B.first_seq == bindparam("first")
            ),
            [{"sid": row.session_id, "first": row.first_seq} for row in chosen],
        )
        # Read after the rows are locked: a rebuild that emptied the backlog before them
        # has committed by now, and its "ok" is seen (PostgreSQL: a new statement).
        state = conn.execute(select(ST.state).where(ST.name == _INDEX_NAME)).scalar()
        if state == "stale":
            return total, 0  # the reindex that repairs the index indexes these too
        entries = []
        for row in chosen:
            messages = conn.execute(
                select(M.seq, M.timestamp, M.role, M.content).where(
                    M.session_id == row.session_id,
                    M.seq >= row.first_seq,
                    M.seq < row.first_seq + row.messages,
                )
            )
            entries += [
                (row.session_id, seq, timestamp, role, document(content))
                for seq, timestamp, role, content in messages
            ]
        first = chosen[0]
        try:
            with conn.begin_nested():
                self.dialect.index_entries(conn, entries)
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated or not self.dialect.transaction_alive(conn):
                raise
            reason = (
                f"indexing {total} messages from session {first.session_id!r} seq "
                f"{first.first_seq} onwards failed: {exc.orig}"
            )
            self._set_state(conn, "stale", reason)
            return total, 0
        return total, len(entries)

    def mark_stale_in(self, conn: Connection, reason: str) -> None:
        """Mark the index stale in ``conn``'s transaction (once: an index already stale is
        not written again, so concurrent appenders do not queue on its row)."""
        self._set_state(conn, "stale", reason)

    def mark_stale(self, reason: str) -> None:
        # If the database refuses even that, the next search finds the index broken
        # itself, and `sessionrepo doctor` reports it.
        with contextlib.suppress(RepoError):
            self.database.write(lambda conn: self._set_state(conn, "stale", reason))

    def _set_state(self, conn: Connection, state: str, reason: str | None) -> None:
        values = {
            "state": state,
            "reason": reason[:2000] if reason else None,
            "updated_at": utcnow(),
        }
        update = search_state_table.update().where(ST.name == _INDEX_NAME).values(**values)
        if state == "stale":
            update = update.where(ST.state != "stale")  # keep the first reason; no write
        updated = conn.execute(update).rowcount
        if not updated and state == "stale":
            exists = conn.execute(select(ST.name).where(ST.name == _INDEX_NAME)).first()
            if exists is not None:
                return
        if not updated:
            conn.execute(search_state_table.insert().values(name=_INDEX_NAME, **values))

    def state(self) -> tuple[str, str | None]:
        """``("ok", None)`` or ``("stale", reason)``."""
        row = self.database.read(
            lambda conn: conn.execute(
                select(ST.state, ST.reason).where(ST.name == _INDEX_NAME)
            ).first()
        )
        return ("ok", None) if row is None else (row.state, row.reason)

    def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Rebuild the whole index from the messages; returns how many were indexed.

        Runs in one transaction, which also empties the backlog: appends and catch-ups
        wait for it (appends through a ``TranscriptWriter`` park in the outbox) and
        nothing is indexed twice or missed.
        """

        def work(conn: Connection) -> int:
            self.dialect.reset_search_index(conn)
            # After the reset: on PostgreSQL it locks out appends and catch-ups first.
            conn.execute(delete(search_backlog_table))
            total = conn.execute(select(func.count()).select_from(messages_table)).scalar_one()
            done = 0
            for batch in _message_batches(conn):
                self.dialect.index_entries(
                    conn,
                    [
                        (session_id, seq, timestamp, role, document(content))
                        for session_id, seq, timestamp, role, content in batch
                    ],
                )
                done += len(batch)
                if progress is not None:
                    progress(done, total)
            self.dialect.finish_search_index(conn)
            self._set_state(conn, "ok", None)
            return done

        return self.database.write(work)

    # -- queries ----------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        session_id: str | None,
        source: str | None,
        role: str | None,
        user_id: str | None,
        since: datetime | None,
        until: datetime | None,
        order: Literal["rank", "newest"],
        limit: int,
        offset: int,
    ) -> list[SearchHit]:
        if not isinstance(query, str):
            raise InvalidMessage("query", f"must be a string, got {type(query).__name__}")
        if not 1 <= limit <= 1000:
            raise InvalidMessage("limit", "must be between 1 and 1000")
        if order not in ("rank", "newest"):
            raise InvalidMessage("order", "must be 'rank' or 'newest'")
        parsed = parse_query(query)
        if not parsed.positive:
            return []  # nothing to look for (only exclusions, or no words at all)
        state, reason, behind = self.database.read(_state_and_backlog)
        if behind and state == "ok":
            # Complete answers: index what was committed before this call (waiting for
            # catch-ups that hold some of it), then read the state that left.
            self._catch_up_for_search()
            state, reason = self.state()
        if state != "ok":
            raise SearchIndexUnavailable(
                f"the search index is stale ({reason}); run `sessionrepo reindex`"
            )
        filters = {
            "session_id": session_id,
            "source": source,
            "role": role,
            "user_id": user_id,
            "since": since,
            "until": until,
        }

        def work(conn: Connection) -> list[SearchHit]:
            rows = self.dialect.search_messages(
                conn,
                parsed,
                filters,
                order=order,
                limit=limit,
                offset=offset,
                window=RANK_WINDOW,
            )
            return [self._hit(parsed, row) for row in rows]

        try:
            return self.database.read(work)
        except SearchIndexUnavailable as exc:
            self.mark_stale(str(exc))
            raise
        except (BackendUnavailable, RepoError) as exc:
            if self.dialect.is_search_index_error(exc):
                self.mark_stale(f"search failed: {exc}")
                raise SearchIndexUnavailable(
                    f"the search index is broken ({exc}); run `sessionrepo reindex`"
                ) from exc
            raise

    def _catch_up_for_search(self) -> None:
        try:
            self.catch_up(wait=True)
        except (BackendUnavailable, RepoError) as exc:
            if self.dialect.is_search_index_error(exc):
                self.mark_stale(f"catching up the index failed: {exc}")
                raise SearchIndexUnavailable(
                    f"the search index is broken ({exc}); run `sessionrepo reindex`"
                ) from exc
            raise

    def _hit(self, parsed: Query, row: Any) -> SearchHit:
        content = decode_text(row.content) if row.content is not None else None
        text = content_text(content)[:INDEX_CHARS]
        snippet = make_snippet(text, parsed)
        if snippet is None:
            # The index named a message that does not say what was asked: it is out of
            # step with the messages, and its answers cannot be trusted.
            raise SearchIndexUnavailable(
                f"the search index is out of sync with the messages (session "
                f"{row.session_id!r} seq {row.seq}); run `sessionrepo reindex`"
            )
        return SearchHit(
            session_id=row.session_id,
            seq=row.seq,
            client_msg_uuid=row.client_msg_uuid,
            role=row.role,
            timestamp=row.timestamp,
            source=row.source,
            user_id=row.user_id,
            snippet=snippet,
            rank=float(row.rank),
        )


def _backlog_keys(conn: Connection) -> list[tuple[str, int]]:
    query = select(B.session_id, B.first_seq).order_by(B.session_id, B.first_seq)
    return [(session_id, first_seq) for session_id, first_seq in conn.execute(query)]


def _backlog_exists(conn: Connection) -> bool:
    return bool(conn.execute(select(exists().select_from(search_backlog_table))).scalar())


def _state_and_backlog(conn: Connection) -> tuple[str, str | None, bool]:
    """Whether the backlog has rows, then the index state. In this order: on PostgreSQL
    each statement sees its own moment, and an empty backlog proves the index complete
    only with the state of that moment or later (a failed catch-up marks the index stale
    as it deletes its rows)."""
    behind = _backlog_exists(conn)
    row = conn.execute(select(ST.state, ST.reason).where(ST.name == _INDEX_NAME)).first()
    state, reason = ("ok", None) if row is None else (row.state, row.reason)
    return state, reason, behind


def _message_batches(
    conn: Connection, size: int = 5000
) -> Iterator[list[tuple[str, int, datetime, str, Any]]]:
    """Every message's (session_id, seq, timestamp, role, content), in key order, a
    batch at a time."""
    after: tuple[str, int] | None = None
    columns = (M.session_id, M.seq, M.timestamp, M.role, M.content)
    while True:
        query = select(*columns).order_by(M.session_id, M.seq).limit(size)
        if after is not None:
            query = query.where(tuple_(M.session_id, M.seq) > tuple_(*after))
        rows = [tuple(row) for row in conn.execute(query)]
        if not rows:
            return
        yield rows
        after = (rows[-1][0], rows[-1][1])


# -- snippets ------------------------------------------------------------------------


def make_snippet(text: str, parsed: Query) -> str | None:
    """A short extract around the first match, matches in [brackets]; ``None`` when the
    text does not satisfy the query (so the index was wrong)."""
    words = " " + document(text) + " "
    positive = parsed.positive
    if not all(_occurs(term, words) for term in positive):
        return None
    if any(_occurs(term, words) for term in parsed.negative):
        return None
    # Walk the source words only as far as the extract needs, from where the first
    # match may begin (again from the start if the guess was wrong: see below).
    begin = end = -1
    marked: list[tuple[int, int]] = []
    hint = _first_possible_match(text, parsed)
    for start in (hint, 0) if hint else (0,):
        flat: list[tuple[str, int, int]] = []  # (index word, source start, source end)
        for match in _SOURCE_WORD.finditer(text, start):
            if end >= 0 and match.start() >= end:
                break
            for part in _WORD.findall(normalize(match.group())):
                flat.append((part, match.start(), match.end()))
                for term in positive:
                    size = len(term.words)
                    if len(flat) >= size and _matches(term, [w for w, _, _ in flat[-size:]]):
                        marked.append((flat[-size][1], flat[-1][2]))
                        if begin < 0:
                            begin = max(0, flat[-size][1] - SNIPPET_CHARS // 3)
                            end = min(len(text), begin + SNIPPET_CHARS)
        if begin >= 0:
            break
    if begin < 0:  # matched words the source splits differently: show the start
        begin, end = 0, min(len(text), SNIPPET_CHARS)
    pieces: list[str] = ["…" if begin else ""]
    cursor = begin
    for start, stop in sorted(marked):
        if start < cursor or stop > end:
            continue
        pieces += [text[cursor:start], "[", text[start:stop], "]"]
        cursor = stop
    pieces.append(text[cursor:end])
    if end < len(text):
        pieces.append("…")
    # Adjacent marks ("[3][.][14]", "[東][京]") read as one.
    return " ".join("".join(pieces).split()).replace("][", "")


#: Source words: runs of letters and digits, and every CJK character or symbol.
_SOURCE_WORD = re.compile(rf"[{_CJK}]|[^\w\s]|[^\W_]+")


def _first_possible_match(text: str, parsed: Query) -> int:
    """Where the first word of a positive term first occurs in the source text as it
    is (0 when it does not), so that a long text is not walked word by word up to
    there. In ASCII text no match can begin before it; in other text the index word may
    come from other source letters (fullwidth "cafe" is "cafe"), so a walk from there that
    finds nothing is done again from the start."""
    first = len(text)
    for term in parsed.positive:
        word = re.escape(term.words[0])
        tail = "" if term.prefix else "(?![A-Za-z0-9])"
        found = re.search(f"(?<![A-Za-z0-9]){word}{tail}", text, re.IGNORECASE)
        if found is not None:
            first = min(first, found.start())
    return 0 if first == len(text) else first


def _matches(term: Term, window: list[str]) -> bool:
    if window[:-1] != list(term.words[:-1]):
        return False
    last, wanted = window[-1], term.words[-1]
    return last == wanted or (term.prefix and last.startswith(wanted))


def _occurs(term: Term, words: str) -> bool:
    """Whether ``term`` occurs in a document's index words (space-separated, with a
    space before the first and after the last)."""
    if len(term.words) == 1:
        needle = " " + term.words[0]
        return needle in words if term.prefix else needle + " " in words
    return re.search(" " + " +".join(map(re.escape, term.words)) + " ", words) is not None
