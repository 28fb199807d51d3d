"""SQLAlchemy's private surface, in one place.

The store's direct path runs statements on a pooled driver connection, outside
SQLAlchemy's statement execution; when the server is lost there, it must do what
SQLAlchemy does on a disconnect it sees itself: discard that connection *and every one
made before it* (a restarted server dropped them all). The pool's public ``invalidate``
on a connection discards only that one; the whole generation is ``Pool._invalidate``,
private, used here and nowhere else in sessionrepo.

pyproject.toml bounds SQLAlchemy to 2.1.x, and ``tests/test_sqlalchemy_compat.py`` fails
when the installed one lacks it or it no longer recycles the older connections.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy.pool import Pool, PoolProxiedConnection

#: The ``Pool`` attributes this module relies on.
REQUIRED: Final = ("_invalidate",)


def invalidate_generation(
    pool: Pool, connection: PoolProxiedConnection, exception: BaseException
) -> None:
    """Invalidate ``connection`` (checked out of ``pool``) and mark every connection the
    pool made before it stale, so that each is replaced at its next checkout."""
    pool._invalidate(connection, exception)
