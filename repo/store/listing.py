"""``list_sessions``: a page of sessions, the most recently active first, each with a
preview of its first user message, and the cursor that continues it.

The order is by activity, exactly (``last_active_at`` plus ``last_active_lag_us``: an
append moves the indexed column only when it is more than a granularity behind, and the
lag otherwise, so that its update stays HOT on PostgreSQL), in one statement; see
:meth:`SessionListing._statement` for how the index still finds the page.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any, Final, Literal

from sqlalchemy import (
    ColumnElement,
    Integer,
    ScalarSelect,
    Select,
    Text,
    bindparam,
    case,
    func,
    literal,
    select,
    tuple_,
)

from sessionrepo.dialects.base import BackendDialect
from sessionrepo.errors import InvalidArgument
from sessionrepo.models import SessionPage, SessionSummary
from sessionrepo.models._limits import check_identifier
from sessionrepo.models.tables import (
    ACTIVITY_GRANULARITY,
    ENCODED_MARK,
    UTCDateTime,
    decode_text,
    messages_table,
    sessions_table,
)
from sessionrepo.search.text import (
    JSON_TEXT_KEY,
    content_text,
    json_string_head,
    json_text_values,
)
from sessionrepo.store import codec as _codec
from sessionrepo.store.arguments import (
    check_choice,
    check_instance,
    check_limit,
    check_optional_text,
)
from sessionrepo.store.database import Database

S = sessions_table.c
M = messages_table.c

#: Characters of the first user message shown by ``list_sessions``.
PREVIEW_LENGTH: Final = 120
#: Most sessions or search hits one call returns.
MAX_PAGE: Final = 1000
#: Before and after every stored time: the bounds of the candidates when there is no
#: floor, and no cursor.
_EARLIEST: Final = datetime(1, 1, 1, tzinfo=UTC)
_LATEST: Final = datetime(9999, 12, 31, tzinfo=UTC)

#: What a page's statement is built for: filtered by source, by user, the status, after
#: a cursor (the values are bound when it runs).
_Shape = tuple[bool, bool, Literal["open", "ended"] | None, bool]


class SessionListing:
    """The pages of :meth:`~sessionrepo.contract.SessionStore.list_sessions`."""

    def __init__(self, database: Database) -> None:
        self._db = database
        # Built once a shape: the construct costs more to build than the statement to run.
        self._statements: dict[_Shape, Select[Any]] = {}

    def page(
        self,
        *,
        source: str | None,
        user_id: str | None,
        status: Literal["open", "ended"] | None,
        limit: int,
        cursor: str | None,
    ) -> SessionPage:
        """One page (arguments as ``list_sessions`` takes them, checked here)."""
        check_optional_text(source, "source")
        check_optional_text(user_id, "user_id")
        if status is not None:
            check_choice(status, "status", ("open", "ended"))
        limit = check_limit(limit, maximum=MAX_PAGE)
        last_page = None if cursor is None else _decode_cursor(cursor)
        shape = (source is not None, user_id is not None, status, last_page is not None)
        statement = self._statements.get(shape)
        if statement is None:
            statement = self._statements[shape] = self._statement(*shape)
        parameters: dict[str, Any] = {"source": source, "user_id": user_id, "limit": limit}
        if last_page is not None:
            parameters["cursor_at"], parameters["cursor_id"] = last_page
            parameters["surely_past"] = last_page[0] - ACTIVITY_GRANULARITY
        rows = self._db.read(lambda conn: list(conn.execute(statement, parameters)))
        summaries = [
            SessionSummary.model_construct(
                **_codec.session_from_row(row, preview=_preview(row.preview))
            )
            for row in rows
        ]
        items = summaries[:limit]
        next_cursor = None
        if len(summaries) > limit:
            last = items[-1]
            assert last.last_active_at is not None
            next_cursor = _encode_cursor(last.last_active_at, last.id)
        return SessionPage(sessions=items, next_cursor=next_cursor)

    def _statement(
        self,
        by_source: bool,
        by_user: bool,
        status: Literal["open", "ended"] | None,
        after_cursor: bool,
    ) -> Select[Any]:
        """A page's one statement, its values bound by name: ``source``, ``user_id``,
        ``limit``; after a cursor, ``cursor_at`` and ``cursor_id`` (the cursor's activity
        and session) and ``surely_past`` (``cursor_at`` less the granularity).

        The order is by activity, last_active_at + last_active_lag_us, exactly; the index
        holds last_active_at, at most ACTIVITY_GRANULARITY (G) behind it. Every session
        whose indexed time is below the cursor's less G is past the cursor; the
        (limit+1)-th of them by indexed time, ``floor``, proves limit+1 sessions past the
        cursor active at ``floor`` or later, so the page is among the sessions indexed from
        floor - G up to the cursor (all of those up to it when there is no floor): a range
        of the index a granularity wider than the page, ranked by the database."""
        dialect = self._db.dialect
        chosen: list[ColumnElement[bool]] = []
        if by_source:
            chosen.append(S.source == bindparam("source"))
        if by_user:
            chosen.append(S.user_id == bindparam("user_id"))
        if status == "open":
            chosen.append(S.ended_at.is_(None))
        elif status == "ended":
            chosen.append(S.ended_at.is_not(None))
        activity = dialect.activity(S.last_active_at, S.last_active_lag_us)
        surely_past = select(S.last_active_at).where(*chosen)
        candidates = select(sessions_table).where(*chosen)
        if after_cursor:
            at = bindparam("cursor_at", type_=UTCDateTime())
            surely_past = surely_past.where(
                S.last_active_at < bindparam("surely_past", type_=UTCDateTime())
            )
            cursor = tuple_(dialect.activity(at, literal(0)), bindparam("cursor_id"))
            candidates = candidates.where(S.last_active_at <= at, tuple_(activity, S.id) < cursor)
        else:
            # Bounded above all the same: PostgreSQL's planner, not knowing the floor yet,
            # guesses a third of the table for one bound (a full scan), 0.5 % for two.
            candidates = candidates.where(S.last_active_at <= _LATEST)
        limit = bindparam("limit", type_=Integer())
        floor = (
            surely_past.order_by(S.last_active_at.desc(), S.id.desc())
            .offset(limit)
            .limit(1)
            .scalar_subquery()
        )
        lowest = func.coalesce(
            dialect.time_before(floor, ACTIVITY_GRANULARITY), literal(_EARLIEST, UTCDateTime())
        )
        ordered = candidates.where(S.last_active_at >= lowest)
        if not dialect.capabilities.correlates_into_subqueries:
            return (
                ordered.add_columns(_preview_column(dialect, S.id).label("preview"))
                .order_by(activity.desc(), S.id.desc())
                .limit(limit + 1)
            )
        # The previews of the page's rows only: in the candidates' select list, SQLite
        # reads one for every candidate before the sort (a burst of appends puts a few
        # hundred sessions within one granularity: 2.4 ms a page of 50, most of it
        # previews never shown).
        page = ordered.order_by(activity.desc(), S.id.desc()).limit(limit + 1).subquery("page")
        return select(page, _preview_column(dialect, page.c.id).label("preview")).order_by(
            dialect.activity(page.c.last_active_at, page.c.last_active_lag_us).desc(),
            page.c.id.desc(),
        )


def _preview_column(dialect: BackendDialect, session_id: ColumnElement[Any]) -> ScalarSelect[Any]:
    """The preview of the listed session ``session_id`` names: the head of its first live
    user message."""
    head = func.substr(M.content, 1, 8192, type_=Text)
    return (
        select(
            case(
                (
                    func.substr(M.content, 1, 1) != ENCODED_MARK,
                    func.substr(M.content, 1, PREVIEW_LENGTH + 1, type_=Text),
                ),
                # Content parts are JSON: read their head, where the text usually is
                # (a long string holding NUL: its start); else, after an image of
                # megabytes, what follows the first text key (marked twice).
                (
                    head.contains(JSON_TEXT_KEY, autoescape=True)
                    | (func.substr(M.content, 2, 1) == '"'),
                    head,
                ),
                else_=literal(ENCODED_MARK * 2)
                + dialect.text_after(M.content, JSON_TEXT_KEY, 8 * PREVIEW_LENGTH),
            )
        )
        .where(M.session_id == session_id, M.role == "user", M.superseded.is_(None))
        .order_by(M.seq)
        .limit(1)
        .scalar_subquery()
    )


def _encode_cursor(last_active_at: datetime, session_id: str) -> str:
    raw = json.dumps([last_active_at.isoformat(), session_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: object) -> tuple[datetime, str]:
    cursor = check_instance(cursor, "cursor", str)
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        when, sid = json.loads(base64.urlsafe_b64decode(padded))
        last_active = datetime.fromisoformat(when)
        if last_active.tzinfo is None or not isinstance(sid, str):
            raise ValueError("not written by _encode_cursor")
        return last_active, check_identifier(sid, "cursor")
    except (ValueError, TypeError) as exc:
        raise InvalidArgument("cursor", "not a cursor returned by list_sessions") from exc


def _preview(stored: str | None) -> str | None:
    if stored is None:
        return None
    if stored.startswith(ENCODED_MARK * 2):  # what followed the first text key
        stored = " ".join(json_text_values(JSON_TEXT_KEY + stored[2 * len(ENCODED_MARK) :]))
    elif stored.startswith(ENCODED_MARK):  # the head of stored JSON: whole when short
        try:
            value = decode_text(stored)
        except ValueError:  # cut: the text parts as far as they go, or a long string's start
            head = stored[len(ENCODED_MARK) :]
            texts = json_text_values(head)
            stored = " ".join(texts) if texts else json_string_head(head) or ""
        else:
            stored = value if isinstance(value, str) else content_text(value)
    text = " ".join(stored.split())
    return text if len(text) <= PREVIEW_LENGTH else text[: PREVIEW_LENGTH - 1] + "…"
