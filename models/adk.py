"""The tables of the Google ADK session service (:mod:`sessionrepo.integrations.adk`).

ADK keeps state in three scopes: the app's (``app:`` keys, shared by every user), the
user's (``user:`` keys, shared by the user's sessions) and the session's (the other keys;
``temp:`` keys are never stored). The sessions and their events are sessionrepo's own
``sessions`` and ``messages``; these tables hold the state, and the ADK names of a
session. They are registered on :data:`sessionrepo.models.tables.Base`'s metadata, so
``alembic check`` compares them with migration 0008 like every other table.

Citus: ``adk_sessions`` has a ``session_id`` and is distributed with its session; the
app and user states are reference tables (few rows, read by every session).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Double, ForeignKey, Index, PrimaryKeyConstraint, String, Table
from sqlalchemy.orm import Mapped, mapped_column

from sessionrepo.models.tables import Base


class AdkAppStateRow(Base):
    """The ``app:`` state of an ADK app (keys without the prefix)."""

    __tablename__ = "adk_app_states"
    __table_args__ = (PrimaryKeyConstraint("app_name"),)

    app_name: Mapped[str]
    state: Mapped[dict[str, Any]]
    #: Epoch seconds of the last change.
    update_time: Mapped[float] = mapped_column(Double())


class AdkUserStateRow(Base):
    """The ``user:`` state of a user of an ADK app (keys without the prefix)."""

    __tablename__ = "adk_user_states"
    __table_args__ = (PrimaryKeyConstraint("app_name", "user_id"),)

    app_name: Mapped[str]
    user_id: Mapped[str]
    state: Mapped[dict[str, Any]]
    update_time: Mapped[float] = mapped_column(Double())


class AdkSessionRow(Base):
    """An ADK session: its names, its own state, and its ``last_update_time`` (epoch
    seconds as ADK has them: the newest event's timestamp). Its events are the
    messages of the sessionrepo session ``session_id``; the state is what their deltas
    made of it, up to ``applied_seq``."""

    __tablename__ = "adk_sessions"
    __table_args__ = (
        PrimaryKeyConstraint("session_id"),
        # list_sessions without a page: an app's (or a user's) sessions.
        Index("ix_adk_sessions_app_name_user_id", "app_name", "user_id"),
    )

    # Goes with its session: a pruned session leaves no state behind.
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    app_name: Mapped[str]
    user_id: Mapped[str]
    adk_session_id: Mapped[str] = mapped_column(String(255))
    state: Mapped[dict[str, Any]]
    update_time: Mapped[float] = mapped_column(Double())
    #: The ``seq`` of the newest event whose state delta is in the three states: events
    #: stored after it (replayed from an outbox) have theirs applied by the next
    #: ``get_session`` or ``append_event``, in ``seq`` order, exactly once.
    applied_seq: Mapped[int]


adk_app_states_table: Table = AdkAppStateRow.__table__  # type: ignore[assignment]
adk_user_states_table: Table = AdkUserStateRow.__table__  # type: ignore[assignment]
adk_sessions_table: Table = AdkSessionRow.__table__  # type: ignore[assignment]
