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
from collections.abc import Iterable, Sequence
from typing import Any, Final

from sessionrepo.models.tables import ENCODED_MARK, WIRE_FIELDS
from sessionrepo.store.codec import LOAD_COLUMNS

_AT: Final = {name: LOAD_COLUMNS.index(name) for name in LOAD_COLUMNS}
#: Wire fields stored as JSON text (``JSONText``), and as ``LosslessText`` (plain text, or
#: the mark and JSON).
_JSON_FIELDS: Final = frozenset({"tool_calls"})
_LOSSLESS_FIELDS: Final = frozenset({"content", "reasoning"})
#: Positions of the wire fields in a row, in ``WIRE_FIELDS`` order.
_WIRE_AT: Final = tuple((name, _AT[name]) for name in WIRE_FIELDS)
_KEY_AT: Final = _AT["client_msg_uuid"]
_EXTRA_AT: Final = _AT["extra"]
_LAYOUT_AT: Final = _AT["openai_keys"]


def _value(name: str, stored: Any) -> Any:
    if stored is None:
        return None
    if name in _LOSSLESS_FIELDS:
        return json.loads(stored[1:]) if stored.startswith(ENCODED_MARK) else stored
    if name in _JSON_FIELDS:
        return json.loads(stored)
    return stored


def wire_dicts(rows: Iterable[Sequence[Any]], *, include_key: bool) -> list[dict[str, Any]]:
    """Rows of :data:`~sessionrepo.store.codec.load_columns` as OpenAI wire dicts."""
    layouts: dict[str, tuple[str, ...]] = {}
    out: list[dict[str, Any]] = []
    for row in rows:
        fields = {name: _value(name, row[at]) for name, at in _WIRE_AT}
        stored_extra = row[_EXTRA_AT]
        extra: dict[str, Any] = json.loads(stored_extra) if stored_extra is not None else {}
        stored_layout = row[_LAYOUT_AT]
        message: dict[str, Any]
        if stored_layout is not None:
            layout = layouts.get(stored_layout)
            if layout is None:
                layout = layouts[stored_layout] = tuple(json.loads(stored_layout))
            message = {key: extra[key] if key in extra else fields[key] for key in layout}
        elif fields["role"] is None:  # an item built directly: its type first
            message = dict(extra)
            message.update(
                (name, fields[name]) for name in WIRE_FIELDS[1:] if fields[name] is not None
            )
        else:
            message = {"role": fields["role"], "content": fields["content"]}
            message.update(
                (name, fields[name]) for name in WIRE_FIELDS[2:] if fields[name] is not None
            )
            message.update(extra)
        if include_key:
            key = row[_KEY_AT]
            message["client_msg_uuid"] = _key_text(key)
        out.append(message)
    return out


def _key_text(key: Any) -> str:
    """The key as ``str(UUID)``: SQLite gives 32 hex digits, psycopg a ``UUID``."""
    if isinstance(key, str):
        return f"{key[:8]}-{key[8:12]}-{key[12:16]}-{key[16:20]}-{key[20:]}"
    return str(key)
