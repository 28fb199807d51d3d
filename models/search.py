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
