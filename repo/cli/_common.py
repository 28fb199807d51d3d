"""What every ``sessionrepo`` command module shares: the error boundary, the URL options,
opening the store, progress bars and the small formatting rules.

It sits under the command modules and imports none of them, so that they can all use it
without importing one another.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, date, datetime, timedelta
from datetime import time as dt_time
from typing import Any, TypeVar

import click
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from sessionrepo.dialects.urls import mask_secrets, url_secrets
from sessionrepo.errors import RepoError
from sessionrepo.models.message import utcnow
from sessionrepo.ops import missing_sqlite_file, parse_duration
from sessionrepo.store.repository import SessionRepository, open_repository

F = TypeVar("F", bound=Callable[..., Any])


#: Where the URL options record what they were given, for masking (``ctx.meta`` is
#: one dict for a whole command line).
_GIVEN_URLS = "sessionrepo.urls"


class Group(click.Group):
    """Turns a library error raised by any subcommand into ``Error: <one line>``.

    Each group that takes a URL of its own uses it, so that its URLs are masked too. A
    SQLAlchemy error that escaped the library (a bug) is one line as well, never a
    traceback that could quote a URL.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RepoError as exc:
            raise click.ClickException(one_line(str(exc), *_urls(ctx))) from exc
        except sa_exc.SQLAlchemyError as exc:
            first = str(exc).split("\n", 1)[0]  # not the statement nor its parameters
            raise click.ClickException(
                one_line(f"database error ({type(exc).__name__}): {first}", *_urls(ctx))
            ) from exc


def _urls(ctx: click.Context | None) -> list[str | None]:
    """The URLs given on this command line (``--url``, ``--outbox-url``, in any place)."""
    urls: list[str | None] = []
    if ctx is not None:
        urls += ctx.meta.get(_GIVEN_URLS, [])
    while ctx is not None:
        urls += [value for name, value in ctx.params.items() if name.endswith("url")]
        ctx = ctx.parent
    return urls


def one_line(message: str, *urls: str | None) -> str:
    """The message on one line, with the URLs' passwords masked should a driver echo them."""
    return " ".join(masked(message, *urls).split())


def masked(message: str, *urls: str | None) -> str:
    """The message with the passwords of ``urls`` (in any place of the URL, in any
    quoting) and ``$PGPASSWORD`` replaced by ``***``; URLs are shown with
    :func:`sessionrepo.dialects.safe_url`, this is for text a driver wrote."""
    return mask_secrets(message, url_secrets(*urls))


def check_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: a value with ``://`` must parse as a database URL."""
    if not value:
        return None  # the library's default: the embedded SQLite file
    ctx.meta.setdefault(_GIVEN_URLS, []).append(value)
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


def share_url_options(group: click.Group, *, skip: Iterable[str] = ()) -> None:
    """Let every URL option of a group (``--url``, ``outbox --outbox-url``) be given
    after its subcommands too, at any depth: ``sessionrepo migrate --url X`` is
    ``sessionrepo --url X migrate``. A later one wins. Commands that have such an
    option of their own keep it; those in ``skip`` (which open no database) get none.

    The copies have no environment variable (the group's option reads it) and are not
    handed to the command: they replace the URL in the click context's object, which
    is where every command reads it (a string, or a dataclass with such fields).
    """
    _share(group, [], set(skip))


def _share(command: click.Command, inherited: list[click.Option], skip: set[str]) -> None:
    own = {param.name for param in command.params}
    for option in inherited:
        if option.name not in own:
            command.params.append(_pass_through(option))
    if isinstance(command, click.Group):
        names = {option.name for option in inherited}
        below = [
            *inherited,
            *(
                param
                for param in command.params
                if isinstance(param, click.Option)
                and (param.name or "").endswith("url")
                and param.name not in names
            ),
        ]
        for name, sub in command.commands.items():
            if name not in skip:
                _share(sub, below, skip)


def _pass_through(option: click.Option) -> click.Option:
    name = option.name or ""

    def given(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        value = check_url(ctx, param, value)
        if value is None:
            return
        if dataclasses.is_dataclass(ctx.obj) and not isinstance(ctx.obj, type):
            ctx.obj = dataclasses.replace(ctx.obj, **{name: value})
        else:
            ctx.obj = value

    return click.Option(
        option.opts,
        callback=given,
        expose_value=False,
        metavar="URL",
        help=f"As {option.opts[0]} before the command (either place works; a later one wins).",
    )


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


#: Seconds between two progress lines when stderr is not a terminal (a log, a pipe).
PROGRESS_INTERVAL = 5.0


@contextmanager
def progress(length: int | None, label: str, *, unit: str = "") -> Iterator[Callable[[int], None]]:
    """Progress on stderr; yields its ``update(amount)``. On a terminal, a bar. Else
    (a log, a pipe, a cron job) one line every :data:`PROGRESS_INTERVAL` seconds,
    ``label: 1,200 of 5,000 (24%)``, and a last one at the end if any was written:
    work that ends sooner writes nothing."""
    if length is not None and sys.stderr.isatty():
        with click.progressbar(length=length, label=label, file=sys.stderr) as bar:
            yield bar.update
        return
    suffix = f" {unit}" if unit else ""
    done = 0
    last = time.monotonic()
    wrote = False

    def line() -> str:
        if length:
            return f"{label}: {done:,} of {length:,}{suffix} ({min(100 * done // length, 100)}%)"
        return f"{label}: {done:,}{suffix} so far"

    def update(amount: int) -> None:
        nonlocal done, last, wrote
        done += amount
        now = time.monotonic()
        if now - last >= PROGRESS_INTERVAL:
            click.echo(line(), err=True)
            last, wrote = now, True

    yield update
    if wrote:
        click.echo(f"{line()}, done", err=True)


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


def rfc3339(value: datetime) -> str:
    """A time as every ``--json`` shows it: RFC 3339 in UTC with a ``Z``, as Pydantic
    writes the report models (``2025-01-31T12:00:00.123456Z``)."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def count(number: int, noun: str) -> str:
    """``1 message``, ``1,024 messages``."""
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def when(value: datetime | None) -> str:
    """A stored time (UTC) to the second, or ``-``."""
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


#: What a terminal would obey or not show: control characters (newline and tab, in text
#: of several lines, are kept), bidirectional controls, zero-width and other invisible
#: format characters, line and paragraph separators, tag characters. (The console,
#: ``sessionrepo.web.views``, spells such characters out as well, as ``<U+202E>``.)
_UNPRINTABLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u2069\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]"
)


def printable(value: str, *, one_line: bool = False) -> str:
    """The one rule for text a command prints that came from a store, a file or a user:
    every character of :data:`_UNPRINTABLE` spelled as its Python escape (``\\x1b``,
    ``\\u202e``), so no transcript can drive the terminal, hide text or reorder what is
    shown. ``one_line`` (a column, an id, a header field): runs of whitespace, newlines
    and tabs included, become one space."""
    value = _UNPRINTABLE.sub(lambda match: ascii(match.group())[1:-1], value)
    return " ".join(value.split()) if one_line else value


def quoted(value: str) -> str:
    """An id in a sentence, ``'discord:1234'``, by the same rule as a column."""
    return f"'{printable(value, one_line=True)}'"


def parse_when(value: str, *, until: bool = False) -> datetime:
    """A moment given on the command line: an RFC 3339 time, UTC unless it says
    (``2025-01-31T12:00:00Z``, ``2025-01-31 12:00+02:00``); a date, the start of that day
    in UTC (with ``until``, of the next day: the date is included whole); or an age, that
    long ago (``90d``, ``12h``: a whole number and s, m, h or d).

    Raises:
        click.BadParameter: none of these.
    """
    try:
        return utcnow() - parse_duration(value)
    except ValueError:
        pass
    try:
        if _DATE.fullmatch(value):
            day = datetime.combine(date.fromisoformat(value), dt_time(), UTC)
            return day + timedelta(days=1) if until else day
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{printable(value, one_line=True)!r} is neither a date (2025-01-31), a time "
            "(2025-01-31T12:00:00Z, UTC unless it says) nor an age (90d, 12h)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


_DATE = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)
