"""Database URLs: which backend, driver and file a URL means, and how it is shown.

Here, beside the engine setup, because the driver is the dialects' choice: the SQLite
dialect swaps ``pysqlite`` for ``aiosqlite`` when it builds an asyncio engine, the
PostgreSQL one relies on psycopg 3 serving both. Nothing here touches a database.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote, quote_plus

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
        return _connectable(_password_in_userinfo(url.set(drivername="postgresql+psycopg")))
    if name == "sqlite":
        if url.host or url.port or url.username or url.password:
            # sqlite://file.db names a host, which SQLite has no use for.
            raise InvalidArgument(
                "url",
                "a SQLite URL has three slashes before a relative path "
                "(sqlite:///file.db) and four before an absolute one "
                "(sqlite:////var/lib/file.db); or give the file path itself",
            )
        return _connectable(url.set(drivername="sqlite+pysqlite"))
    raise InvalidArgument(
        "url", f"unsupported database {name!r}: sessionrepo runs on SQLite and PostgreSQL"
    )


def database_file(url: URL) -> Path | None:
    """The file a SQLite URL (as :func:`normalize_url` gives it) names; ``None`` for a
    server's URL or an in-memory database. The one place that tells a SQLite file."""
    database = url.database
    if url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    return Path(database)


def _connectable(url: URL) -> URL:
    """``url``, once SQLAlchemy has turned it into the driver's arguments as an engine
    would: a query value it cannot take (``?timeout=abc``) is an ``InvalidArgument``
    here, not a ``ValueError`` from deep inside ``create_engine``. Nothing connects."""
    try:
        url.get_dialect()().create_connect_args(url)
    except (sa_exc.ArgumentError, ValueError, TypeError) as exc:
        reason = mask_secrets(str(exc).split("\n", 1)[0], url_secrets(url))
        raise InvalidArgument("url", f"{safe_url(url)} cannot be used: {reason}") from None
    return url


def _password_in_userinfo(url: URL) -> URL:
    """libpq's ``?password=`` moved to the URL's password (what the driver gets is the
    same: the query's value wins, as it would): SQLAlchemy then masks it in its own
    ``repr`` of the URL and of the engine, which know nothing of the query's."""
    value = url.query.get("password")
    if value is None:
        return url
    password = value[-1] if isinstance(value, tuple) else value
    return url.difference_update_query(["password"]).set(password=password)


MASK = "***"

# ``password=secret`` in a libpq connection string (``host=db password='a b'``), and
# in a value that holds one (``?options=...``): its value up to a space, or quoted.
_CONNINFO_PASSWORD = re.compile(r"""(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&;]+)""", re.I)


def _is_secret_key(key: str) -> bool:
    """``password``, ``PASSWORD``, ``sslpassword``...: libpq's keys that hold a secret."""
    return "password" in key.lower()


def safe_url(url: str | URL | None) -> str:
    """The URL as sessionrepo shows it anywhere (messages, logs, reprs, CLI output): its
    password masked wherever it was given: the userinfo (``user:secret@``), a query
    parameter whose name says password (``?password=``, any case, ``sslpassword``), or a
    libpq connection string (``password=secret``) in a query value or as the whole text.
    """
    if url is None:
        return "(default)"
    if isinstance(url, str) and "://" not in url:
        return _CONNINFO_PASSWORD.sub(rf"\1{MASK}", url)  # a file path, or a conninfo
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except (sa_exc.ArgumentError, ValueError):
        return "(unparseable URL)"
    query: dict[str, str | tuple[str, ...]] = {}
    for key, value in parsed.query.items():
        if _is_secret_key(key):
            query[key] = MASK
        elif isinstance(value, tuple):
            query[key] = tuple(_CONNINFO_PASSWORD.sub(rf"\1{MASK}", item) for item in value)
        else:
            query[key] = _CONNINFO_PASSWORD.sub(rf"\1{MASK}", value)
    shown = parsed.set(query=query).render_as_string(hide_password=True)
    return shown.replace(quote(MASK, safe=""), MASK)  # the query's masks, readable


def url_secrets(*urls: str | URL | None) -> set[str]:
    """The secrets the ``urls`` carry (as :func:`safe_url` finds them), and the
    ``PGPASSWORD`` the driver would use, each in the forms a message may quote it in:
    what :func:`mask_secrets` takes out of a text."""
    found: set[str] = set()
    for url in urls:
        if url is None:
            continue
        text = url if isinstance(url, str) else url.render_as_string(hide_password=False)
        found.update(match.group(2).strip("'") for match in _CONNINFO_PASSWORD.finditer(text))
        if "://" not in text:
            continue
        try:
            parsed = make_url(url) if isinstance(url, str) else url
        except (sa_exc.ArgumentError, ValueError):
            continue
        if parsed.password:
            found.add(str(parsed.password))
        for key, value in parsed.query.items():
            if _is_secret_key(key):
                found.update(value if isinstance(value, tuple) else (value,))
    environ = os.environ.get("PGPASSWORD")
    if environ:
        found.add(environ)
    return {
        form
        for secret in found
        if secret
        for form in (secret, quote(secret, safe=""), quote_plus(secret))
    }


def mask_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` (see :func:`url_secrets`) replaced by ``***``
    where it stands as a whole (not inside a longer word: a password ``p`` leaves
    "sqlite" alone), should a driver or a caller's message quote one."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = re.sub(rf"(?<![\w]){re.escape(secret)}(?![\w])", MASK, text)
    return text
