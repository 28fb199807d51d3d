"""Opening a separate outbox store: a SQLite file made private and durable for a writer,
or read where it lies for the commands that only read it, with errors that say which
file, what is wrong and what to do.

A place that cannot hold an outbox (a directory, a read-only filesystem, a folder or file
this user may not write, a path through a file) is a configuration error
(:class:`~sessionrepo.errors.InvalidArgument` on ``outbox_url``): retrying will not help.
An outbox that fails for a reason that may pass (a full disk, an I/O error, too many open
files, a lock) stays :class:`~sessionrepo.errors.BackendUnavailable`.

Reading a file on a read-only filesystem: SQLite opens a WAL database read-only
(``mode=ro``) only if it can use the ``-shm`` file beside it, which it cannot create
there. Where there is no ``-wal`` file with content, it is opened ``immutable=1``
instead: SQLite then takes no locks and uses no ``-shm``, which is safe because nobody can
change a file on a read-only filesystem, and complete because everything committed is in
the file itself. With a ``-wal`` that has content, ``immutable`` would silently leave its
transactions out: then the file is read ``mode=ro`` when its ``-shm`` is there too, and
refused, saying why, when it is not.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Final

from sqlalchemy.engine import URL

from sessionrepo.dialects import database_file, normalize_url, safe_url
from sessionrepo.errors import (
    ArgumentTypeError,
    BackendUnavailable,
    InvalidArgument,
    NotARepository,
)
from sessionrepo.store import schema
from sessionrepo.store.database import Database

#: ``OSError`` numbers that say the place is wrong, not that it is busy or full: a
#: configuration error, which retrying does not fix.
_MISCONFIGURED: Final = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.EISDIR,
        errno.ENOTDIR,
        errno.ENOENT,
        errno.ENAMETOOLONG,
        errno.ELOOP,
    }
)

#: SQLite's result codes for a file it could not open or write (as the dialect names them).
_OPEN_CODES: Final = frozenset({"SQLITE_CANTOPEN", "SQLITE_READONLY", "SQLITE_PERM"})


def open_outbox_database(
    url: str | URL,
    *,
    asynchronous: bool = False,
    read_only: bool = False,
    tenant: str | None = None,
) -> Database:
    """A separate outbox store. A SQLite file is created private (mode 0600) where there
    is none, kept durable (WAL, ``synchronous=FULL``) and migrated by the same Alembic
    environment (``asynchronous``: on its asyncio driver, checked and migrated on first
    use). With ``read_only`` (``sessionrepo outbox status``), it is neither created nor
    migrated, and opened read-only, on a read-only filesystem too (see the module
    docstring).

    A symbolic link at the file's path is refused, dangling or not: the outbox would be
    made, or read, wherever the link points. So is a file that is not a sessionrepo
    store (another application's database gets none of sessionrepo's tables).

    Raises:
        NotARepository: the path is a symbolic link, or names a file that is not a
            sessionrepo store (``read_only``: or no file).
        InvalidArgument: the place cannot hold an outbox (a directory; a read-only
            filesystem or a folder or file this user may not write, unless
            ``read_only``; a file that cannot be read): the message names the file,
            the cause and the fix.
        BackendUnavailable: the file, or its folder, cannot be created or opened for a
            reason that may pass (a full disk, an I/O error, too many open files).

    A file read ``immutable`` shows so in its ``display_url`` (the URI it was opened by).

    ``tenant``: the tenant whose messages the file parks (the writer's ``tenant=``); a file
    holds one tenant's, as a SQLite store does (:mod:`sessionrepo.store.tenancy`), and
    another tenant's writer is refused with
    :class:`~sessionrepo.errors.TenantMismatch`.
    """
    if not isinstance(url, str | URL):
        raise ArgumentTypeError(
            "outbox_url", f"must be a string or a URL, got {type(url).__name__}"
        )
    parsed = normalize_url(url)
    options: dict[str, Any] = {} if tenant is None else {"tenant": tenant}
    path = _sqlite_path(parsed)
    if database_file(parsed) is not None:
        options["sqlite_synchronous"] = "FULL"
    if path is not None:
        if read_only:
            parsed = _readable_url(parsed, path)
        else:
            _check_writable(path)
    # The SQLite dialect creates a missing file 0600 (O_EXCL: never through a link made
    # since the check above) and refuses another application's file before any write.
    try:
        database = Database(parsed, asynchronous=asynchronous, read_only=read_only, **options)
        # Asynchronous: no I/O outside the event loop's calls, so on first use.
        schema.check_schema(database, auto_migrate=False if read_only else None, defer=asynchronous)
    except BackendUnavailable as exc:
        if path is None:
            raise
        raise _explained(exc, path, read_only=read_only) from exc
    return database


def reading_database(url: str | URL) -> Database:
    """An existing outbox store opened for reading only, unchecked (``doctor`` looks at
    its schema itself): what :func:`open_outbox_database` with ``read_only`` opens."""
    parsed = normalize_url(url)
    path = _sqlite_path(parsed)
    if path is not None:
        parsed = _readable_url(parsed, path)
    return Database(parsed, read_only=True)


def _sqlite_path(url: URL) -> Path | None:
    """The outbox's file, for a SQLite file named by its path (not ``:memory:``, not the
    caller's own ``file:`` URI, which SQLite opens as given); a symbolic link or a
    directory refused."""
    path = database_file(url)
    if path is None:
        return None
    if path.is_symlink():
        raise NotARepository(
            f"the outbox path {_shown(path)} is a symbolic link; give the file's own path "
            "(an outbox is never made or read through a link)",
            path=str(path),
        )
    if url.query.get("uri") in ("true", "1"):
        return None
    if path.is_dir():
        raise InvalidArgument(
            "outbox_url",
            f"{_shown(path)} is a directory, not an outbox file: name the file in it "
            f"(for example {_shown(path / 'outbox.db')})",
        )
    return path


def _readable_url(url: URL, path: Path) -> URL:
    """``url``, or, for a file on a read-only filesystem that holds everything committed
    to it, the URI that opens it ``immutable`` (see the module docstring)."""
    if not path.exists() or not _read_only_filesystem(path):
        return url  # the dialect opens it mode=ro (or says there is no file)
    wal, shm = _beside(path, "-wal"), _beside(path, "-shm")
    if not _has_content(wal):
        query = {**url.query, "mode": "ro", "immutable": "1", "uri": "true"}
        return url.set(database=path.absolute().as_uri(), query=query)
    if not shm.exists():
        raise InvalidArgument(
            "outbox_url",
            f"the outbox file {_shown(path)} is on a read-only filesystem and its "
            f"{_shown(wal)} holds transactions SQLite can read only with a {_shown(shm)} "
            "file, which it cannot create there: copy the file and its -wal to a writable "
            "folder and read the copy, or remount the filesystem read-write",
        )
    return url  # -wal and -shm there: mode=ro reads them


def _check_writable(path: Path) -> None:
    """Raise :class:`InvalidArgument` when a writer could not use ``path`` for reasons
    of configuration: the file, or (for its ``-wal`` and ``-shm``) its folder, not
    writable. A missing file is the dialect's to create (and to fail creating).

    Asked with ``access(2)``, never by opening the file: closing any descriptor of a
    SQLite file drops every POSIX lock this process holds on it, a connection's too.
    """
    if not path.exists():
        return
    if not os.access(path, os.R_OK | os.W_OK):
        raise _unwritable(path, _denial(path))
    for companion in (_beside(path, "-wal"), _beside(path, "-shm")):
        if companion.exists():
            if not os.access(companion, os.R_OK | os.W_OK):
                raise _unwritable(companion, _denial(companion))
        elif not os.access(path.parent, os.W_OK | os.X_OK):
            raise _unwritable(path.parent, _denial(path.parent), companion=companion)


def _unwritable(place: Path, code: int, *, companion: Path | None = None) -> InvalidArgument:
    cause = os.strerror(code)
    what = f"the folder {_shown(place)}" if companion is not None else _shown(place)
    need = f" (SQLite keeps {_shown(companion)} beside the outbox)" if companion is not None else ""
    fix = (
        "remount the filesystem read-write"
        if code == errno.EROFS
        else "give the gateway's user write permission on the file and its folder"
    )
    return InvalidArgument(
        "outbox_url",
        f"{what} cannot be written ({cause}){need}: a TranscriptWriter parks messages "
        f"there. {fix[0].upper()}{fix[1:]}, or set outbox_url / SESSIONREPO_OUTBOX_URL to a "
        "writable place; `sessionrepo outbox status` can still read it",
    )


def _explained(exc: BackendUnavailable, path: Path, *, read_only: bool) -> Exception:
    """The error for an outbox file SQLite could not open or create: a configuration
    error when the file system says the place is wrong, else ``exc`` with the file named."""
    cause = exc.__cause__
    if isinstance(cause, OSError) and cause.errno in _MISCONFIGURED:
        return _uncreatable(path, cause.errno)  # the dialect could not make the file
    if exc.code in _OPEN_CODES:
        problem = _unreadable(path) if read_only else _unusable(path)
        if problem is not None:
            return problem
    # The file and its folder may be used: a failure that may pass (too many open files,
    # an I/O error, a lock).
    return BackendUnavailable(
        f"the outbox file {_shown(path)} could not be opened now ({exc}); retry later",
        code=exc.code,
    )


def _uncreatable(path: Path, code: int) -> InvalidArgument:
    return InvalidArgument(
        "outbox_url",
        f"the outbox file {_shown(path)} cannot be created ({os.strerror(code)}): give a "
        "path in a folder the gateway's user may write (it is made if missing), or set "
        "outbox_url / SESSIONREPO_OUTBOX_URL to one",
    )


def _unusable(path: Path) -> InvalidArgument | None:
    """Why SQLite could not open or create ``path`` for writing, when the file system
    says: a part of the path that is a file, a folder or file this user may not write."""
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        return _uncreatable(path, errno.ENOTDIR)
    if not path.exists():
        if parent.is_dir() and not os.access(parent, os.W_OK | os.X_OK):
            return _uncreatable(path, _denial(parent))
        return None
    try:
        _check_writable(path)
    except InvalidArgument as problem:
        return problem
    return None


def _unreadable(path: Path) -> InvalidArgument | None:
    """Why SQLite could not open ``path`` read-only, when the file system says: the
    file not readable, or no ``-shm`` beside it and a folder it cannot be made in."""
    if not os.access(path, os.R_OK):
        return InvalidArgument(
            "outbox_url",
            f"the outbox file {_shown(path)} cannot be read ({os.strerror(_denial(path))}): "
            "run as the gateway's user, or give this user read permission on it",
        )
    shm = _beside(path, "-shm")
    if not shm.exists() and not os.access(path.parent, os.W_OK | os.X_OK):
        return InvalidArgument(
            "outbox_url",
            f"the outbox file {_shown(path)} cannot be read while nobody has it open: SQLite "
            f"needs {_shown(shm)} beside it, and this user may not create it in its folder: "
            "run as the gateway's user, or read it while the gateway runs",
        )
    return None


def _read_only_filesystem(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _denial(path: Path) -> int:
    """Why this user may not write (or read) ``path``: a read-only filesystem, or not
    permitted."""
    return errno.EROFS if _read_only_filesystem(path) else errno.EACCES


def _beside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _has_content(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


def _shown(path: Path) -> str:
    """A path as messages show it (the project's secret-safe rendering)."""
    return safe_url(str(path))
