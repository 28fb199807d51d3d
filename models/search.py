"""Search results."""

from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class SearchHit(BaseModel):
    """One message that matches a search, with a highlighted extract."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    seq: int
    client_msg_uuid: uuid.UUID
    #: ``None`` for a Responses-API item without a role.
    role: str | None
    timestamp: datetime
    source: str
    user_id: str | None = None
    #: An extract around the first match, the matched words in [brackets] (brackets the
    #: message itself holds are not escaped: ``snippet_parts`` tells them apart).
    snippet: str
    #: The same extract as ``(text, is_match)`` runs, for showing matches unambiguously.
    snippet_parts: list[tuple[str, bool]] = Field(default_factory=list)
    #: Relevance (higher is better) for ``order="rank"``; 0 for ``order="newest"``.
    rank: float


class SearchResults(list[SearchHit]):
    """The hits of ``search(..., mode="semantic" | "hybrid")``: a list of
    :class:`SearchHit`, saying how complete the semantic part of it was.

    ``complete`` is ``False`` when some messages had no current vector of the
    embedder's model when the search ran (the catch-up had more to do than one search
    does, or the store's vectors are of another model, or no embedder is installed);
    ``notice`` then says what and what fixes it. A hybrid search still returns every
    keyword hit then: it is never silently worse than keyword search.
    """

    def __init__(
        self,
        hits: list[SearchHit],
        *,
        mode: str,
        complete: bool = True,
        notice: str | None = None,
    ) -> None:
        super().__init__(hits)
        self.mode = mode
        self.complete = complete
        self.notice = notice

    def __repr__(self) -> str:
        return (
            f"SearchResults({list.__repr__(self)}, mode={self.mode!r}, "
            f"complete={self.complete!r}, notice={self.notice!r})"
        )
