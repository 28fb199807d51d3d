"""The append and load hot paths bypass SQLAlchemy's type processing and Pydantic's
``model_construct`` (issue 7): what they store and what they build must be exactly what
the slow, generic paths would.

- loading decodes the driver's values into ``StoredMessage`` objects identical to the
  ones the typed columns plus ``model_construct`` give;
- SQLite stores keys and times as SQLAlchemy's ``Uuid`` and ``UTCDateTime`` store them;
- the content hash of a message never changes (it is compared with stored hashes).
"""

from __future__ import annotations

import copy
import hashlib
import pickle
import re
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import Row, select
from sqlalchemy.dialects import sqlite as sqlite_dialect

from sessionrepo import Message, SessionRepository, StoredMessage, open_repository
from sessionrepo.models.message import (
    is_validated,
    mark_validated,
    parse_uuid,
    trusted_stored_message,
)
from sessionrepo.models.tables import (
    HASHED_COLUMNS,
    MESSAGE_COLUMNS,
    MESSAGE_PLACE,
    MESSAGE_STATE,
    UTCDateTime,
    dump_json,
    dump_layout,
    messages_table,
)
from sessionrepo.store import codec as _codec

M = messages_table.c

MESSAGES = [
    Message(role="user", content="plain"),
    Message(role="user", content="héllo wörld 日本語 👍", timestamp=datetime(1, 1, 1, tzinfo=UTC)),
    Message(
        role="user", content="nul\x00inside", timestamp=datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
    ),
    Message(role="user", content="\ufdd0starts with the mark"),
    Message(role="user", content=[{"type": "text", "text": "part"}, {"type": "image_url"}]),
    Message(role="user", content={"a": 1, "b": [1.5, None, True]}),
    Message(role="user", content=""),
    Message(role="assistant", content=None, tool_calls=[{"id": "c1", "function": {"x": 1}}]),
    Message(role="assistant", content="x", reasoning="why\x00", finish_reason="stop"),
    Message(role="tool", content="out", tool_call_id="c1", tool_name="f", token_count=-(2**63)),
    Message(role="user", content="x", platform_message_id="p-1", extra={"name": "bob", "z": {}}),
    Message(
        role="user",
        content="x",
        timestamp=datetime(2026, 11, 29, 23, 30, 0, 1, tzinfo=timezone(timedelta(hours=-5))),
    ),
    Message.from_openai({"role": "user", "content": "x", "name": "bob", "refusal": None}),
    Message.from_openai({"content": None, "role": "assistant", "tool_calls": []}),
]


@pytest.fixture
def stored(database_url: str) -> Iterator[tuple[SessionRepository, list[StoredMessage]]]:
    repository = open_repository(database_url)
    repository.append("s", MESSAGES)
    yield repository, repository.load_transcript("s")
    repository.close()


def _typed_message(row: Row[Any]) -> StoredMessage:
    """A row read with the typed columns as a ``StoredMessage``, by ``model_construct``."""
    values = {name: getattr(row, name) for name in StoredMessage.model_fields}
    values["extra"] = values["extra"] or {}
    if values["openai_keys"] is not None:
        values["openai_keys"] = tuple(values["openai_keys"])
    message = StoredMessage.model_construct(**values)
    mark_validated(message)
    return message


def _typed_load(repository: SessionRepository) -> list[StoredMessage]:
    """The generic path: SQLAlchemy's column types decode, ``model_construct`` builds."""
    columns = [M[name] for name in (*MESSAGE_PLACE, *MESSAGE_COLUMNS, *MESSAGE_STATE)]
    query = select(*columns).where(M.session_id == "s").order_by(M.seq)
    return repository.database.read(
        lambda conn: [_typed_message(row) for row in conn.execute(query)]
    )


def _reference_hash(row: dict[str, Any]) -> bytes:
    """The content hash as first defined: over the stored text of each content column."""
    parts = []
    for name in HASHED_COLUMNS:
        value = row[name]
        if value is None:
            parts.append(b"\x00")
        else:
            data = str(value).encode("utf-8")
            parts += (b"\x01", len(data).to_bytes(8, "big"), data)
    return hashlib.sha256(b"".join(parts)).digest()[:16]


def test_loaded_messages_are_what_the_typed_columns_give(
    stored: tuple[SessionRepository, list[StoredMessage]],
) -> None:
    repository, loaded = stored
    expected = _typed_load(repository)
    assert loaded == expected
    for fast, slow in zip(loaded, expected, strict=True):
        assert type(fast) is StoredMessage
        assert list(fast.__dict__) == list(slow.__dict__)  # field order: repr, dumps
        assert repr(fast) == repr(slow)
        assert fast.model_dump() == slow.model_dump()
        assert fast.model_fields_set == slow.model_fields_set
        assert fast.__pydantic_private__ == slow.__pydantic_private__
        assert fast.timestamp.tzinfo is UTC
        assert type(fast.client_msg_uuid) is uuid.UUID
    assert [message.to_openai() for message in loaded] == [m.to_openai() for m in MESSAGES]


def test_a_loaded_message_is_a_real_frozen_validated_model(
    stored: tuple[SessionRepository, list[StoredMessage]],
) -> None:
    message = stored[1][-3]
    assert is_validated(message)
    with pytest.raises(ValidationError):
        message.role = "user"  # type: ignore[misc]
    copied = message.model_copy()
    assert copied == message
    assert is_validated(copied)
    assert not is_validated(message.model_copy(update={"content": "changed"}))
    assert pickle.loads(pickle.dumps(message)) == message
    assert copy.deepcopy(message) == message
    again = StoredMessage.model_validate(message.model_dump())
    assert again == message
    # Instances share nothing mutable.
    other = stored[1][-4]
    assert message.model_fields_set is not other.model_fields_set
    assert message.__pydantic_private__ is not other.__pydantic_private__
    assert message.extra is not other.extra


def test_trusted_construction_matches_model_construct() -> None:
    fields = {
        "client_msg_uuid": uuid.uuid4(),
        "role": "user",
        "content": "x",
        "tool_calls": None,
        "tool_call_id": None,
        "tool_name": None,
        "reasoning": None,
        "finish_reason": None,
        "token_count": None,
        "timestamp": datetime.now(UTC),
        "platform_message_id": None,
        "extra": {},
        "openai_keys": ("role", "content"),
        "session_id": "s",
        "seq": 1,
        "superseded": None,
    }
    assert list(fields) == list(StoredMessage.model_fields)
    slow = mark_validated(StoredMessage.model_construct(**fields))
    fast = trusted_stored_message(dict(fields))
    assert fast == slow
    assert fast.__dict__ == slow.__dict__
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.__pydantic_private__ == slow.__pydantic_private__
    assert fast.__pydantic_extra__ == slow.__pydantic_extra__


def test_sqlite_stores_keys_and_times_as_sqlalchemy_types_would(tmp_path: Any) -> None:
    path = tmp_path / "store.db"
    repository = open_repository(str(path))
    try:
        repository.append("s", MESSAGES)
    finally:
        repository.close()
    dialect = sqlite_dialect.dialect()
    to_time = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
    assert to_time is not None
    connection = sqlite3.connect(path)
    try:
        rows = connection.execute(
            'SELECT client_msg_uuid, "timestamp", content_hash FROM messages ORDER BY seq'
        ).fetchall()
        active = connection.execute("SELECT last_active_at FROM sessions").fetchone()[0]
    finally:
        connection.close()
    for (key, stamp, digest), message in zip(rows, MESSAGES, strict=True):
        assert key == message.client_msg_uuid.hex
        assert stamp == to_time(message.timestamp)
        assert type(digest) is bytes
        assert len(digest) == 16
    assert len(active) == 26
    assert active[19] == "."


def test_content_hash_is_unchanged() -> None:
    """Stored hashes decide duplicate or conflict: the function must never change."""
    when = datetime(2026, 11, 29, tzinfo=UTC)
    full = Message(
        client_msg_uuid=uuid.UUID(int=7),
        role="assistant",
        content="héllo\x00 wörld",
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        reasoning="why",
        finish_reason="stop",
        token_count=42,
        timestamp=when,
        extra={"name": "bob"},
    )
    parts = Message(
        client_msg_uuid=uuid.UUID(int=8),
        role="user",
        content=[{"type": "text", "text": "x"}],
        timestamp=when,
    )
    _, rows = _codec.prepare_messages([full, parts])
    assert rows[0]["content_hash"].hex() == "39c025fb7411e6a7a7dca0f3aad261fa"
    assert rows[1]["content_hash"].hex() == "5b1ec3a6dd504ae21f844c7e80b71c43"
    assert _reference_hash(rows[0]) == rows[0]["content_hash"]
    assert _reference_hash(rows[1]) == rows[1]["content_hash"]


@pytest.mark.parametrize(
    "text",
    [
        uuid.UUID(int=5).hex,
        str(uuid.UUID(int=2**128 - 1)),
        str(uuid.UUID(int=12345)).upper(),
        "{12345678-1234-5678-1234-567812345678}",
        "urn:uuid:12345678-1234-5678-1234-567812345678",
        "+" + "f" * 31,
        "-" + "f" * 31,
        "0x" + "f" * 30,
        "1_" + "f" * 30,
        "--" + "a" * 32 + "--",
        "g" * 32,
        "f" * 31,
        "",
        "12345678-1234-5678-1234-56781234567g",
    ],
)
def test_parse_uuid_is_uuid(text: str) -> None:
    try:
        expected = uuid.UUID(text)
    except ValueError as exc:
        with pytest.raises(ValueError, match=re.escape(str(exc))):
            parse_uuid(text)
        return
    parsed = parse_uuid(text)
    assert parsed == expected
    assert hash(parsed) == hash(expected)
    assert str(parsed) == str(expected)
    assert parsed.is_safe == uuid.SafeUUID.unknown
    assert pickle.loads(pickle.dumps(parsed)) == expected


def test_dump_layout_is_dump_json() -> None:
    for keys in [("role", "content"), ("role", "naïve", "ключ"), ()]:
        assert dump_layout(keys) == dump_json(list(keys))
        assert dump_layout(keys) == dump_json(list(keys))  # remembered


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"openai_keys": ("role", "role")}, "listed twice"),
        ({"openai_keys": ("role", "zz")}, "neither a wire field nor in extra"),
        ({"openai_keys": ("content",)}, "would be dropped"),
        ({"content": "x", "openai_keys": ("role",)}, "would be dropped"),
        ({"extra": {"a": 1}, "openai_keys": ("role",)}, "would be dropped"),
        ({"extra": {"content": 1}}, "are named fields"),
    ],
)
def test_layout_errors_still_name_the_problem(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Message(role="user", **values)
