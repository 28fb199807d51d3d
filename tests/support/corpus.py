"""A store's worth of sessions and how two stores are compared: the corpus the operator
tools' tests export, import and prune (``ops/test_maintenance.py``, ``cli/test_cli_ops.py``),
and backdating a session as time passing would."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, update

from sessionrepo import Message, SessionRepository, open_repository
from sessionrepo.models.tables import sessions_table
from sessionrepo.ops import MAX_BATCH
from sessionrepo.store.database import Database

S = sessions_table.c

#: Messages in the long session: more than one export page and one import batch.
BIG = MAX_BATCH * 2 + 37


# -- the corpus and how it is compared ------------------------------------------------


def build_corpus(repository: SessionRepository) -> list[str]:
    """Sessions that use every field the store keeps; their ids."""
    root = "discord:chan-1"
    repository.create_session(
        root,
        source="discord",
        user_id="user-1",
        title="Title with NUL \x00 and \ufdd0 a noncharacter",
        model="gpt-x",
        model_config={"temperature": 0.7, "b": [1, 2.5, None, True], "a": {"z": 1, "y": -0.0}},
        system_prompt="You are helpful.\n\tBe brief.",
        metadata={"zeta": 1, "alpha": {"k": "v"}, "big": 2**70},
        input_tokens=123,
        output_tokens=456,
    )
    repository.append(
        root,
        [
            Message.from_openai(
                {"role": "user", "content": "héllo 👋\nline two\x00 after NUL"},
                timestamp=datetime(2024, 2, 29, 23, 59, 59, 999_999, UTC),
            ),
            Message.from_openai(
                {
                    "zz": {"b": 1, "a": [1.5, "x"]},
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                        }
                    ],
                    "reasoning": "Think first.",
                    "finish_reason": "tool_calls",
                    "token_count": 42,
                    "platform_message_id": "msg-9",
                    "aa": None,
                    "timestamp": "a gateway's own field, kept in extra",
                },
                timestamp=1_500_000_000.25,
            ),
            Message.from_openai(
                {
                    "role": "tool",
                    "tool_call_id": "call_1",
                    "tool_name": "get_weather",
                    "content": "18C",
                }
            ),
            Message.from_openai(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ],
                    "name": "alice",
                }
            ),
            Message(role="assistant", content={"structured": [1, {"b": 2, "a": 1}]}),
            Message(role="assistant", content="\ufdd0 starts with the mark"),
            Message(
                role="system",
                content="",
                timestamp=datetime(1999, 12, 31, 23, 0, 0, 1, UTC),
                extra={"priority": 3},
            ),
        ],
    )
    child = "discord:chan-1:rotated"
    repository.append(
        child,
        [Message(role="user", content="continued"), Message(role="assistant", content="ok")],
        source="discord",
        user_id="user-1",
        parent_session_id=root,
    )
    repository.end_session(child, "compressed")
    empty = "telegram:empty"
    repository.create_session(empty, source="telegram", user_id="user-2")
    repository.end_session(empty, "no messages")
    big = "cli:long"
    for start in range(0, BIG, 400):
        repository.append(
            big,
            [
                Message(role="user", content=f"message {i}")
                for i in range(start, min(start + 400, BIG))
            ],
            source="cli",
        )
    return sorted([root, child, empty, big])


def snapshot(url: str) -> dict[str, dict[str, Any]]:
    """Everything the store holds, per session, in a form where order and type count."""
    database = Database(url)
    repository = open_repository(url, auto_migrate=False)
    try:
        rows = database.read(lambda c: c.execute(select(S.id, S.next_seq).order_by(S.id)).all())
        state: dict[str, dict[str, Any]] = {}
        for session_id, next_seq in rows:
            session = repository.get_session(session_id)
            messages = repository.load_transcript(session_id)
            state[session_id] = {
                # JSON text keeps key order and tells 1 from 1.0 and "x" from None.
                "session": _exact(session.model_dump(mode="json", by_alias=True)),
                "next_seq": next_seq,
                "seqs": [m.seq for m in messages],
                "messages": [_exact(m.model_dump(mode="json")) for m in messages],
                "openai": [json.dumps(m.to_openai(include_key=True)) for m in messages],
                "timestamps": [m.timestamp.isoformat() for m in messages],
            }
        return state
    finally:
        repository.close()
        database.dispose()


def _exact(dump: dict[str, Any]) -> dict[str, str]:
    return {name: json.dumps(value) for name, value in dump.items()}


def assert_same_store(source: str, target: str, only: list[str] | None = None) -> None:
    expected, actual = snapshot(source), snapshot(target)
    if only is not None:
        expected = {sid: expected[sid] for sid in only}
    assert sorted(actual) == sorted(expected)
    for session_id, want in expected.items():
        got = actual[session_id]
        for field, value in want["session"].items():  # field by field, for a clear failure
            assert got["session"][field] == value, (session_id, field)
        assert got["next_seq"] == want["next_seq"], session_id
        assert got["seqs"] == want["seqs"], session_id
        for index, message in enumerate(want["messages"]):
            for field, value in message.items():
                assert got["messages"][index][field] == value, (session_id, index, field)
        assert got == want, session_id


def set_times(
    url: str, session_id: str, *, ended_at: datetime | None, last_active_at: datetime
) -> None:
    """Age a session, as time passing would (the store has no API to backdate)."""
    database = Database(url)
    try:
        database.write(
            lambda conn: conn.execute(
                update(sessions_table)
                .where(S.id == session_id)
                .values(ended_at=ended_at, last_active_at=last_active_at)
            )
        )
    finally:
        database.dispose()
