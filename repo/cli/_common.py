"""What every ``sessionrepo`` command module shares: the error boundary, the URL options,
opening the store, progress bars and the small formatting rules.

It sits under the command modules and imports none of them, so that they can all use it
without importing one another.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote, quote_plus

import click
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from sessionrepo.errors import RepoError
from sessionrepo.ops import missing_sqlite_file
from sessionrepo.store.repository import SessionRepository, open_repository

F = TypeVar("F", bound=Callable[..., Any])


class Group(click.Group):
    """Turns a library error raised by any subcommand into ``Error: <one line>``.

    Each group that takes a URL of its own uses it, so that its URLs are masked too.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RepoError as exc:
            raise click.ClickException(one_line(str(exc), *_urls(ctx))) from exc


def _urls(ctx: click.Context | None) -> list[str | None]:
    """The URLs given to this command and the groups above it (``--url``, ``--outbox-url``)."""
    urls: list[str | None] = []
    while ctx is not None:
        urls += [value for name, value in ctx.params.items() if name.endswith("url")]
        ctx = ctx.parent
    return urls


def one_line(message: str, *urls: str | None) -> str:
    """The message on one line, with the URLs' passwords masked should a driver echo them."""
    return " ".join(masked(message, *urls).split())


def masked(message: str, *urls: str | None) -> str:
    """The message with the passwords of ``urls`` (in any quoting) replaced by ``***``."""
    for url in urls:
        password = _password(url)
        if password:
            for form in {password, quote(password, safe=""), quote_plus(password)}:
                message = message.replace(form, "***")
    return message


def _password(url: str | None) -> str | None:
    if not url or "://" not in url:
        return None
    try:
        return make_url(url).password
    except (sa_exc.ArgumentError, ValueError):
        return None


def check_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: a value with ``://`` must parse as a database URL."""
    if not value:
        return None  # the library's default: the embedded SQLite file
    if "://" in value:
        try:
            make_url(value)
        except (sa_exc.ArgumentError, ValueError) as exc:
            # Not echoed: a URL that does not parse may still hold a password.
            raise click.BadParameter(
                f"not a database URL ({type(exc).__name__}); expected e.g. "
                "postgresql://user@host/dbname or sqlite:///path/to/file.db"
            ) from None
    return value


def url_option(name: str, *, envvar: str, help: str) -> Callable[[F], F]:
    """A database URL option (``--url``, ``--outbox-url``): checked, read from ``envvar``."""
    return click.option(name, envvar=envvar, callback=check_url, metavar="URL", help=help)


@contextmanager
def open_store(url: str | None, *, read_only: bool = False) -> Iterator[SessionRepository]:
    """The repository at ``url``; a SQLite file must exist (opening would create it).
    ``read_only``: for a command that only reads (never migrated, nothing written)."""
    missing = missing_sqlite_file(url)
    if missing is not None:
        raise click.ClickException(
            f"no database file at {missing}; check --url / SESSIONREPO_DATABASE_URL"
        )
    repository = open_repository(url, read_only=read_only)
    try:
        yield repository
    finally:
        repository.close()


@contextmanager
def progress(length: int | None, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr (only drawn on a terminal); yields its ``update``."""
    if length is None or not sys.stderr.isatty():
        yield lambda _: None
        return
    with click.progressbar(length=length, label=label, file=sys.stderr) as bar:
        yield bar.update


@contextmanager
def progress_to_total(label: str) -> Iterator[Callable[[int, int], None]]:
    """:func:`progress` for work that learns its total as it goes: yields a callback
    taking ``(done, total)``, which draws the bar from its first call on."""
    with ExitStack() as stack:
        shown = 0
        advance: Callable[[int], None] | None = None

        def update(done: int, total: int) -> None:
            nonlocal advance, shown
            if advance is None:
                advance = stack.enter_context(progress(total, label))
            advance(done - shown)
            shown = done

        yield update


def count(number: int, noun: str) -> str:
    """``1 message``, ``1,024 messages``."""
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def when(value: datetime | None) -> str:
    """A stored time (UTC) to the second, or ``-``."""
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


# Control characters (but newline and tab) and bidirectional overrides: printed as
# escapes, so a transcript cannot drive the terminal or disguise what it shows.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(value: str, *, one_line: bool = False) -> str:
    """Stored text made safe for a terminal; with ``one_line``, its whitespace collapsed."""
    value = _UNPRINTABLE.sub(lambda match: ascii(match.group())[1:-1], value)
    return " ".join(value.split()) if one_line else value
