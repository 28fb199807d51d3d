"""Database URLs: which backend and driver a URL means, and how it is shown.

Here, beside the engine setup, because the driver is the dialects' choice: the SQLite
dialect swaps ``pysqlite`` for ``aiosqlite`` when it builds an asyncio engine, the
PostgreSQL one relies on psycopg 3 serving both. Nothing here touches a database.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url

from sessionrepo.errors import ArgumentTypeError, InvalidArgument


def default_database_path() -> Path:
    """Where the embedded SQLite store lives when no URL is configured."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "sessionrepo" / "sessionrepo.db"


def normalize_url(url: str | URL | None) -> URL:
    """A SQLAlchemy URL with the driver sessionrepo uses for that database.

    ``None`` means ``SESSIONREPO_DATABASE_URL``, else the embedded SQLite file. A bare
    file path is a SQLite file. ``postgresql://`` and ``postgres://`` use psycopg 3.

    Raises:
        InvalidArgument: not a URL, or a database sessionrepo does not run on
            (``ArgumentTypeError``: neither a string nor a URL).
    """
    if url is not None and not isinstance(url, str | URL):
        raise ArgumentTypeError("url", f"must be a string or a URL, got {type(url).__name__}")
    if not url:
        url = os.environ.get("SESSIONREPO_DATABASE_URL") or None
    if url is None:
        return URL.create("sqlite+pysqlite", database=str(default_database_path()))
    if isinstance(url, str):
        if "://" not in url:
            return URL.create("sqlite+pysqlite", database=url)
        try:
            url = make_url(url)
        except (sa_exc.ArgumentError, ValueError):
            # Not echoed: a URL that does not parse may still hold a password.
            raise InvalidArgument(
                "url",
                "not a database URL; expected postgresql://user@host/dbname, "
                "sqlite:///path/to/file.db or a file path",
            ) from None
    name = url.get_backend_name()
    if name in ("postgresql", "postgres"):
        return url.set(drivername="postgresql+psycopg")
    if name == "sqlite":
        return url.set(drivername="sqlite+pysqlite")
    raise InvalidArgument(
        "url", f"unsupported database {name!r}: sessionrepo runs on SQLite and PostgreSQL"
    )


def safe_url(url: str | URL | None) -> str:
    """The URL with any password masked, for messages and logs."""
    if url is None:
        return "(default)"
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except sa_exc.ArgumentError:
        return "(unparseable URL)"
    return parsed.render_as_string(hide_password=True)
