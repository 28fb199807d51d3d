"""What sessionrepo can store faithfully, and the checks that enforce it.

Everything accepted here round-trips exactly on SQLite and PostgreSQL; everything else is
rejected with an error naming the field before any database is touched. The limits are
part of the public contract and are listed in the README.
"""

from __future__ import annotations

import math
from typing import Any, Final

#: Largest stored size of one message (UTF-8 bytes of its text and JSON fields).
MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
#: Longest session id, user id, source, tool call id, platform message id and similar keys.
MAX_ID_LENGTH: Final = 255
#: Deepest nesting of lists and objects inside a JSON field.
MAX_JSON_DEPTH: Final = 64
#: Largest magnitude of an integer inside a JSON field (beyond it, JSON tools disagree).
MAX_JSON_INT_BITS: Final = 256
#: Largest ``seq``, limit or count an argument may give: a signed 64-bit integer, what
#: both backends bind (SQLite raises ``OverflowError`` past it, PostgreSQL a range error).
MAX_INT64: Final = 2**63 - 1


def check_text(value: str, field: str) -> str:
    """Accept any string that is valid Unicode: NUL and control characters included.

    Only lone surrogates are refused: no UTF-8 database can hold them.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{field}: lone surrogate {value[exc.start]!r} at position {exc.start} "
            "is not valid Unicode and cannot be stored"
        ) from None
    return value


def check_identifier(value: str, field: str, max_length: int = MAX_ID_LENGTH) -> str:
    """Identifiers are short, printable strings: no NUL, no control characters."""
    check_text(value, field)
    if not value:
        raise ValueError(f"{field}: must not be empty")
    if len(value) > max_length:
        raise ValueError(f"{field}: {len(value)} characters, the limit is {max_length}")
    for position, char in enumerate(value):
        if char < " " or "\x7f" <= char <= "\x9f":
            raise ValueError(
                f"{field}: control character {char!r} at position {position} "
                "is not allowed in an identifier"
            )
    return value


def check_json(value: Any, field: str) -> Any:
    """Accept only JSON that comes back with the same types, values and key order.

    Allowed: ``None``, ``bool``, ``int`` (up to 256 bits), finite ``float``, ``str``
    (valid Unicode), ``list`` and ``dict`` with ``str`` keys, nested at most 64 deep.
    Tuples, sets, bytes and subclasses of the JSON types are refused because they would
    come back as something else.

    Returns:
        A deep copy of ``value``, so that a caller who changes its own lists and dicts
        afterwards does not change what was validated.
    """
    return _copy(value, field, 0)


def _copy(value: Any, path: str, depth: int) -> Any:
    if value is None or value is True or value is False:
        return value
    kind = type(value)
    if kind is str:
        return check_text(value, path)
    if kind is int:
        if value.bit_length() > MAX_JSON_INT_BITS:
            raise ValueError(f"{path}: integer wider than {MAX_JSON_INT_BITS} bits")
        return value
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(f"{path}: {value!r} is not valid JSON (NaN and Infinity are refused)")
        return value
    if kind is list:
        if depth >= MAX_JSON_DEPTH:
            raise ValueError(f"{path}: nested deeper than {MAX_JSON_DEPTH} levels")
        return [_copy(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)]
    if kind is dict:
        if depth >= MAX_JSON_DEPTH:
            raise ValueError(f"{path}: nested deeper than {MAX_JSON_DEPTH} levels")
        copied = {}
        for key, item in value.items():
            if type(key) is not str:
                raise ValueError(f"{path}: key {key!r} is not a string")
            check_text(key, f"{path}.<key>")
            copied[key] = _copy(item, f"{path}.{key}", depth + 1)
        return copied
    raise ValueError(
        f"{path}: {kind.__name__} is not a JSON type "
        "(use None, bool, int, float, str, list or dict)"
    )
