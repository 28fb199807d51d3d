"""The SQL of a search page both backends share: the page of hits is chosen on the
index alone, then the content of those hits only is read (see :func:`page_of_hits`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Float,
    Row,
    String,
    Text,
    TextClause,
    Uuid,
    bindparam,
    text,
)
from sqlalchemy.types import TypeEngine

from sessionrepo.models.tables import UTCDateTime

#: The stored content of a hit, cut to what is indexed (whole when it is encoded JSON,
#: which cannot be cut).
_CONTENT_HEAD = (
    "CASE WHEN substr(m.content, 1, 1) = '\ufdd0' THEN m.content "
    "ELSE substr(m.content, 1, 100000) END"
)

_SEARCH_COLUMNS: dict[str, TypeEngine[Any]] = {
    "session_id": String(),
    "seq": BigInteger(),
    "client_msg_uuid": Uuid(),
    "role": String(),
    "timestamp": UTCDateTime(),
    "source": String(),
    "user_id": String(),
    "content": Text(),
    "extra": Text(),
    "tool_calls": Text(),
    "tool_name": String(),
    "rank": Float(),
}


def page_of_hits(matches: str, outer_order: str, *, one_session: bool = False) -> str:
    """Choose the page on the index alone (``matches``: a query of session_id, seq and
    rank), then read the content of those hits only (never carry message text through
    the choice). ``one_session``: every hit is of the session ``:f_session_id`` names,
    and the reads of messages and sessions say so (Citus routes them to its shard)."""
    routed = " AND m.session_id = :f_session_id AND s.id = :f_session_id" if one_session else ""
    return (
        f"SELECT m.session_id, m.seq, m.client_msg_uuid, m.role, m.timestamp, s.source, "
        f"s.user_id, {_CONTENT_HEAD} AS content, m.extra AS extra, "
        "m.tool_calls AS tool_calls, m.tool_name AS tool_name, top.rank AS rank "
        f"FROM ({matches}) top "
        "JOIN messages m ON m.session_id = top.session_id AND m.seq = top.seq "
        f"JOIN sessions s ON s.id = m.session_id{routed} "
        f"ORDER BY {outer_order}"
    )


def bind_times(statement: TextClause, params: dict[str, Any]) -> TextClause:
    """``statement`` with the time filters (``:f_since``, ``:f_until``) bound as
    ``UTCDateTime``, so they compare as the stored times do."""
    kinds = {"f_since": UTCDateTime(), "f_until": UTCDateTime()}
    return statement.bindparams(
        *(bindparam(name, type_=kind) for name, kind in kinds.items() if name in params)
    )


def run_search(connection: Connection, sql: str, params: dict[str, Any]) -> list[Row[Any]]:
    """The rows of a :func:`page_of_hits` query, typed as ``search_messages`` returns them."""
    statement = bind_times(text(sql), params).columns(**_SEARCH_COLUMNS)
    return list(connection.execute(statement, params))
