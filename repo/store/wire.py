"""A transcript as the OpenAI wire dicts a gateway sends before each model call, straight
from the stored columns: no ``StoredMessage`` is built or validated on the way.

Each dict equals ``message.to_openai()`` (``to_openai(include_key=True)`` with
``include_key``) of the ``StoredMessage`` that :func:`sessionrepo.store.codec.stored_messages`
would build from the same row: the stored key order (``openai_keys``) when the message
came from a dict, else the fields the model names, then ``extra``. Every value is freshly
decoded from the row's JSON or text, so the dicts are the caller's to change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Any, Final

from sqlalchemy import type_coerce
from sqlalchemy.types import NullType

from sessionrepo.models.tables import ENCODED_MARK, WIRE_FIELDS, messages_table

#: What a wire load reads, in this order: the wire fields (``WIRE_FIELDS``), then the
#: extra keys and the stored key order; :func:`wire_columns` adds the key when the dicts
#: carry it. Not the time, the place or the state that a ``StoredMessage`` needs: each
#: column fetched costs every row (at 10,000 rows on SQLite, about 0.7 ms a column).
WIRE_COLUMNS: Final = (*WIRE_FIELDS, "extra", "openai_keys")
_KEYED: Final = (*WIRE_COLUMNS, "client_msg_uuid")
_SELECTED: Final = {
    columns: tuple(type_coerce(messages_table.c[name], NullType()).label(name) for name in columns)
    for columns in (WIRE_COLUMNS, _KEYED)
}


def wire_columns(*, include_key: bool) -> tuple[str, ...]:
    """The columns :func:`wire_dicts` decodes, by name."""
    return _KEYED if include_key else WIRE_COLUMNS


def wire_selected(*, include_key: bool) -> tuple[Any, ...]:
    """:func:`wire_columns` as the driver returns them, for ``select()`` (no result
    processing)."""
    return _SELECTED[wire_columns(include_key=include_key)]


_FIELDS: Final = len(WIRE_FIELDS)
_AT: Final = {name: at for at, name in enumerate(_KEYED)}
#: Wire fields stored as ``LosslessText`` (plain text, or the mark and JSON).
_LOSSLESS_AT: Final = (_AT["content"], _AT["reasoning"])
#: The wire field stored as JSON text (``JSONText``).
_TOOL_CALLS_AT: Final = _AT["tool_calls"]
_ROLE_AT: Final = _AT["role"]
_CONTENT_AT: Final = _AT["content"]
_REASONING_AT: Final = _AT["reasoning"]
_EXTRA_AT: Final = _AT["extra"]
_LAYOUT_AT: Final = _AT["openai_keys"]
_KEY_AT: Final = _AT["client_msg_uuid"]
_loads = json.loads


class _Layout:
    """A stored key order, resolved once: each key's wire field position (``None``: an
    extra key), and, where every key is a wire field, what picks their values."""

    __slots__ = ("keys", "pick", "positions")

    def __init__(self, stored: str) -> None:
        self.keys: tuple[str, ...] = tuple(_loads(stored))
        self.positions = tuple(
            _AT[key] if key in _AT and _AT[key] < _FIELDS else None for key in self.keys
        )
        self.pick: Callable[[Sequence[Any]], Sequence[Any]] | None = None
        wired = [at for at in self.positions if at is not None]
        if len(wired) == len(self.keys) > 1:
            self.pick = itemgetter(*wired)
        elif len(wired) == len(self.keys) == 1:
            only = wired[0]
            self.pick = lambda values: (values[only],)


def wire_dicts(rows: Iterable[Sequence[Any]], *, include_key: bool) -> list[dict[str, Any]]:
    """Rows of :func:`wire_columns` (``include_key`` the same) as OpenAI wire dicts."""
    layouts: dict[str, _Layout] = {}
    out: list[dict[str, Any]] = []
    append = out.append
    mark = ENCODED_MARK
    for row in rows:
        content = row[_CONTENT_AT]
        values: Sequence[Any] = row  # the row itself, unless a field is JSON to decode
        if (
            row[_TOOL_CALLS_AT] is not None
            or row[_REASONING_AT] is not None
            or (content is not None and content.startswith(mark))
        ):
            values = _decoded(row)
        stored_extra = row[_EXTRA_AT]
        stored_layout = row[_LAYOUT_AT]
        message: dict[str, Any]
        if stored_layout is not None:
            layout = layouts.get(stored_layout)
            if layout is None:
                layout = layouts[stored_layout] = _Layout(stored_layout)
            if stored_extra is None and layout.pick is not None:  # the usual message
                message = dict(zip(layout.keys, layout.pick(values), strict=True))
            else:
                extra = _loads(stored_extra) if stored_extra is not None else {}
                message = {
                    key: extra[key] if key in extra or at is None else values[at]
                    for key, at in zip(layout.keys, layout.positions, strict=True)
                }
        else:
            extra = _loads(stored_extra) if stored_extra is not None else {}
            if values[_ROLE_AT] is None:  # an item built directly: its type first
                message = dict(extra)
                message.update(
                    (name, value)
                    for name, value in zip(WIRE_FIELDS[1:], values[1:_FIELDS], strict=True)
                    if value is not None
                )
            else:
                message = {"role": values[_ROLE_AT], "content": values[_CONTENT_AT]}
                message.update(
                    (name, value)
                    for name, value in zip(WIRE_FIELDS[2:], values[2:_FIELDS], strict=True)
                    if value is not None
                )
                message.update(extra)
        if include_key:
            message["client_msg_uuid"] = _key_text(row[_KEY_AT])
        append(message)
    return out


def _decoded(row: Sequence[Any]) -> list[Any]:
    """A row's wire fields, those stored as JSON decoded."""
    values = list(row[:_FIELDS])
    for at in _LOSSLESS_AT:
        text = values[at]
        if text is not None and text.startswith(ENCODED_MARK):
            values[at] = _loads(text[1:])
    if values[_TOOL_CALLS_AT] is not None:
        values[_TOOL_CALLS_AT] = _loads(values[_TOOL_CALLS_AT])
    return values


def _key_text(key: Any) -> str:
    """The key as ``str(UUID)``: SQLite gives 32 hex digits, psycopg a ``UUID``."""
    if isinstance(key, str):
        return f"{key[:8]}-{key[8:12]}-{key[12:16]}-{key[16:20]}-{key[20:]}"
    return str(key)
