"""``search``: keyword, by meaning, or both fused, with its arguments checked here.

The indexes are :mod:`.search_index` (keyword: FTS5, tsvector) and :mod:`.semantic`
(vectors); this component chooses between them, catches the semantic index up by a
bounded amount before it answers, and says in the result when it could not be complete.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from sessionrepo.errors import ArgumentTypeError, InvalidArgument, SemanticSearchUnavailable
from sessionrepo.models import SearchHit, SearchResults
from sessionrepo.models.message import to_utc
from sessionrepo.search.query import SearchFilters
from sessionrepo.store.arguments import (
    check_choice,
    check_instance,
    check_int,
    check_limit,
    check_optional_session_id,
    check_optional_text,
)
from sessionrepo.store.listing import MAX_PAGE
from sessionrepo.store.search_index import SearchIndex
from sessionrepo.store.semantic import FUSION_DEPTH, SEARCH_CATCH_UP, SemanticIndex, fuse


class SessionSearch:
    """The searches of :meth:`~sessionrepo.contract.SessionStore.search`."""

    def __init__(self, keyword: SearchIndex, semantic: SemanticIndex) -> None:
        self._keyword = keyword
        self._semantic = semantic

    def search(
        self,
        query: str,
        *,
        session_id: str | None,
        source: str | None,
        role: str | None,
        user_id: str | None,
        since: datetime | float | None,
        until: datetime | float | None,
        order: Literal["rank", "newest"],
        limit: int,
        cursor: int | str | None,
        mode: Literal["keyword", "semantic", "hybrid"],
    ) -> list[SearchHit]:
        """One page of hits (arguments as ``search`` takes them, checked here)."""
        check_instance(query, "query", str)
        check_choice(mode, "mode", ("keyword", "semantic", "hybrid"))
        check_optional_session_id(session_id)
        for name, value in (("source", source), ("role", role), ("user_id", user_id)):
            check_optional_text(value, name)
        check_choice(order, "order", ("rank", "newest"))
        limit = check_limit(limit, maximum=MAX_PAGE)
        offset = _offset(cursor)
        filters = SearchFilters(
            session_id=session_id,
            source=source,
            role=role,
            user_id=user_id,
            since=_moment(since, "since"),
            until=_moment(until, "until"),
        )
        if mode == "keyword":
            return self._by_keyword(query, filters, order, limit, offset)
        with self._semantic.answering():  # one read of the semantic index's state
            return self._by_meaning(query, filters, mode, limit, offset)

    def _by_keyword(
        self,
        query: str,
        filters: SearchFilters,
        order: Literal["rank", "newest"],
        limit: int,
        offset: int,
    ) -> list[SearchHit]:
        return self._keyword.search(
            query,
            session_id=filters.session_id,
            source=filters.source,
            role=filters.role,
            user_id=filters.user_id,
            since=filters.since,
            until=filters.until,
            order=order,
            limit=limit,
            offset=offset,
        )

    def _by_meaning(
        self,
        query: str,
        filters: SearchFilters,
        mode: Literal["semantic", "hybrid"],
        limit: int,
        offset: int,
    ) -> SearchResults:
        reason = self._semantic.unavailable()
        if mode == "semantic" and reason is not None:
            raise SemanticSearchUnavailable(f"semantic search is unavailable: {reason}")
        complete, notice = True, None
        if reason is None:
            # What was appended since the last catch-up, a bounded amount (the rest is
            # the drainer's or `catch_up_semantic_index`'s; the result says so).
            if self._semantic.catch_up(SEARCH_CATCH_UP).pending:
                complete = False
                notice = (
                    "some messages have no vectors yet (the semantic catch-up is behind); "
                    "run `sessionrepo reindex --semantic` or catch_up_semantic_index()"
                )
        else:
            complete, notice = False, f"keyword hits only: {reason}"
        if mode == "semantic":
            hits = self._semantic.search(query, filters, limit=limit, offset=offset)
            return SearchResults(hits, mode=mode, complete=complete, notice=notice)
        keyword = self._by_keyword(query, filters, "rank", FUSION_DEPTH, 0)
        if reason is not None:
            return SearchResults(
                keyword[offset : offset + limit], mode=mode, complete=complete, notice=notice
            )
        semantic = self._semantic.search(query, filters, limit=FUSION_DEPTH, offset=0)
        hits = fuse([keyword, semantic], limit=limit, offset=offset)
        return SearchResults(hits, mode=mode, complete=complete, notice=notice)


def _offset(cursor: object) -> int:
    """``search``'s cursor (the hits already read: an ``int``, or its digits as text,
    as a command line hands it over) as an offset."""
    if isinstance(cursor, str):
        text = cursor.strip()
        if not text.isascii() or not text.isdigit():
            raise InvalidArgument("cursor", "must be the number of hits already read")
        cursor = int(text)
    return 0 if cursor is None else check_int(cursor, "cursor")


def _moment(moment: object, name: str) -> datetime | None:
    """``since`` or ``until``: an aware datetime or epoch seconds, as UTC."""
    if isinstance(moment, bool) or not isinstance(moment, datetime | int | float | None):
        raise ArgumentTypeError(
            name, f"must be an aware datetime or epoch seconds, got {type(moment).__name__}"
        )
    try:
        return None if moment is None else to_utc(moment, name)
    except ValueError as exc:
        raise InvalidArgument(name, str(exc).removeprefix(f"{name}: ")) from None
