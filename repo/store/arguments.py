"""Checks of the public API's arguments, run before any SQL.

A call asked wrongly must fail the same way on every backend, and with sessionrepo's own
errors: left to the drivers, SQLite binds ``after_seq="x"`` and compares it as text (an
empty page, silently), overflows on ``2**64`` with a bare ``OverflowError``, and
PostgreSQL refuses both as data errors. So every public method of the repository, the
writer and the async API checks its arguments with these, and raises
:class:`~sessionrepo.errors.ArgumentTypeError` for a wrong type, else
:class:`~sessionrepo.errors.InvalidArgument`. What a message or a session may hold is the
codec's to check (:class:`~sessionrepo.errors.InvalidMessage`).

It sits in the store because the store, the outbox and the async API all use it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import datetime
from typing import Any, Final, SupportsIndex, TypeVar, cast

from sessionrepo.errors import ArgumentTypeError, InvalidArgument, InvalidMessage
from sessionrepo.models._limits import MAX_INT64, check_identifier

T = TypeVar("T")


def _kind(value: object) -> str:
    return type(value).__name__


def check_int(value: object, field: str, *, minimum: int = 0, maximum: int = MAX_INT64) -> int:
    """An integer (anything with ``__index__``, a bool excepted) in ``minimum..maximum``."""
    if isinstance(value, bool):
        raise ArgumentTypeError(field, "must be an integer, got bool")
    try:
        number = operator.index(cast(SupportsIndex, value))
    except TypeError:
        raise ArgumentTypeError(field, f"must be an integer, got {_kind(value)}") from None
    if not minimum <= number <= maximum:
        bounds = f"at least {minimum}" if number < minimum else f"at most {maximum}"
        raise InvalidArgument(field, f"must be {bounds}, got {number}")
    return number


def check_seq(value: object, field: str) -> int | None:
    """A ``seq`` cursor: ``None`` or an integer in ``0..2**63-1``."""
    return None if value is None else check_int(value, field)


def check_limit(value: object, field: str = "limit", *, maximum: int = MAX_INT64) -> int:
    """A page size: an integer in ``1..maximum``."""
    return check_int(value, field, minimum=1, maximum=maximum)


def check_bool(value: object, field: str) -> bool:
    """``True`` or ``False`` (not 0, 1 or ``"yes"``)."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(field, f"must be True or False, got {_kind(value)}")
    return value


#: The longest duration an argument may give, in seconds (about 24 days): the longest
#: timeout the backends take (PostgreSQL's ``statement_timeout`` and SQLite's busy
#: timeout are C ints of milliseconds). Past it, a timeout would fail on one backend
#: and wrap around on the other.
MAX_SECONDS: Final = (2**31 - 1) // 1000


def check_seconds(value: object, field: str, *, allow_zero: bool = False) -> float:
    """A duration: a finite int or float, positive (or zero, with ``allow_zero``), at
    most :data:`MAX_SECONDS`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentTypeError(field, f"must be a number of seconds, got {_kind(value)}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "more than zero"
        raise InvalidArgument(field, f"must be {bound} seconds, got {value!r}")
    if value > MAX_SECONDS:
        raise InvalidArgument(field, f"must be at most {MAX_SECONDS} seconds, got {value!r}")
    return float(value)


def check_aware_time(value: object, field: str) -> datetime:
    """A timezone-aware ``datetime`` (an instant: a naive one would mean a different moment
    on each backend and machine)."""
    value = check_instance(value, field, datetime)
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(field, "must be timezone-aware")
    return value


def check_choice(value: T, field: str, choices: Collection[object]) -> T:
    """One of ``choices`` (compared by type too: ``1`` is not ``True``)."""
    if not any(type(value) is type(choice) and value == choice for choice in choices):
        expected = ", ".join(repr(choice) for choice in choices)
        raise InvalidArgument(field, f"must be one of {expected}, got {value!r}")
    return value


def check_text(value: object, field: str) -> str:
    """An identifier-like string (a filter such as ``source`` or ``role``, a search
    configuration): what can be stored in such a column, so what can match it."""
    if not isinstance(value, str):
        raise ArgumentTypeError(field, f"must be a string, got {_kind(value)}")
    try:
        return check_identifier(value, field)
    except ValueError as exc:
        raise InvalidArgument(field, str(exc).removeprefix(f"{field}: ")) from None


def check_session_id(value: object, field: str = "session_id") -> str:
    """A session id: a string (else :class:`ArgumentTypeError`) that can be one (else
    :class:`InvalidMessage`, as when storing: it is the key a transcript is stored
    under), wherever it is given, to a write or to a read."""
    if not isinstance(value, str):
        raise ArgumentTypeError(field, f"must be a string, got {_kind(value)}")
    try:
        return check_identifier(value, field)
    except ValueError as exc:
        raise InvalidMessage(field, str(exc).removeprefix(f"{field}: ")) from None


def check_optional_session_id(value: object, field: str = "session_id") -> str | None:
    """``None``, or :func:`check_session_id`."""
    return None if value is None else check_session_id(value, field)


def check_optional_text(value: object, field: str) -> str | None:
    """``None``, or :func:`check_text`."""
    return None if value is None else check_text(value, field)


def check_iterable(value: T, field: str) -> T:
    """Something to iterate over (a list, a generator...); what its items may be is
    the caller's to check."""
    if not isinstance(value, Iterable):
        raise ArgumentTypeError(field, f"must be a list, got {_kind(value)}")
    return value


def check_many(value: object, field: str, what: str) -> list[Any]:
    """Several items (a list, tuple, set, a mapping's keys or another iterable) as a
    list: never one string or bytes, which iterate as something else (``"abc"`` as three
    ids)."""
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, Iterable):
        raise ArgumentTypeError(field, f"must be a list of {what}, got {_kind(value)}")
    return list(value)


def check_session_ids(value: object, field: str = "session_ids") -> list[str]:
    """Several session ids (see :func:`check_many`), each checked as one."""
    return [
        check_session_id(sid, f"{field}[{index}]")
        for index, sid in enumerate(check_many(value, field, "session ids"))
    ]


def check_callable(value: T | None, field: str) -> T | None:
    """``None`` or something callable."""
    if value is not None and not callable(value):
        raise ArgumentTypeError(field, f"must be callable, got {_kind(value)}")
    return value


def check_instance(value: object, field: str, kind: type[T]) -> T:
    """An instance of ``kind``."""
    if not isinstance(value, kind):
        name = "string" if kind is str else kind.__name__
        raise ArgumentTypeError(field, f"must be a {name}, got {_kind(value)}")
    return value


def check_options(
    options: Mapping[str, Any], checks: Mapping[str, Callable[[Any, str], object]]
) -> dict[str, Any]:
    """Keyword options, each known and checked by its ``checks`` entry (called with the
    value and its field name, ``options.<name>``); returns them as checked."""
    checked: dict[str, Any] = {}
    for name, value in options.items():
        check = checks.get(name)
        if check is None:
            known = ", ".join(sorted(checks))
            raise ArgumentTypeError(f"options.{name}", f"unknown option; the options are {known}")
        checked[name] = check(value, f"options.{name}")
    return checked
