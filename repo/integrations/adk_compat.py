"""Google ADK's private surface, in one place.

ADK's ``Session`` carries a private revision marker, ``_storage_update_marker`` (a
pydantic ``PrivateAttr``), that its own database services set when they hand out a
session and compare in ``append_event`` to refuse a stale session object
(``StaleSessionError``). sessionrepo's service keeps the same marker (the session's
``next_seq`` as text), so a session object behaves with it as with ADK's services. ADK
offers no public accessor: this module reads and writes the attribute, and nothing else in
sessionrepo touches an ADK private.

pyproject.toml bounds google-adk to the major version checked to have it (2.x), and
``tests/integrations/test_adk_compat.py`` fails when the installed ADK's ``Session`` lacks
it: raise the bound only after that test passes on the new version.
"""

from __future__ import annotations

from typing import Final

from google.adk.sessions import Session

#: The private attribute of ADK's ``Session`` this module relies on.
MARKER: Final = "_storage_update_marker"


def has_marker(session_class: type[Session] = Session) -> bool:
    """Whether ``session_class`` (ADK's ``Session``) declares the marker."""
    return MARKER in getattr(session_class, "__private_attributes__", {})


def update_marker(session: Session) -> str | None:
    """The revision ``session`` was handed out at (``None``: none recorded)."""
    marker: str | None = getattr(session, MARKER)
    return marker


def set_update_marker(session: Session, marker: str | None) -> None:
    """Record the revision ``session`` now reflects."""
    setattr(session, MARKER, marker)
