"""Search results."""

from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict


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
    #: An extract around the first match, the matched words in [brackets].
    snippet: str
    #: Relevance (higher is better) for ``order="rank"``; 0 for ``order="newest"``.
    rank: float
