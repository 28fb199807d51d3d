"""The direct load on Citus: a transcript (whole, a page, the wire form) is one
statement in autocommit on the coordinator, which sends the session's worker that
SELECT alone (no transaction opened there, nothing committed), on both APIs; an empty
or unknown session still falls back to the read that tells the two apart.

Needs ``SESSIONREPO_TEST_CITUS_URL`` (``python tests/citus_cluster.py start`` prints
one); skipped without it (failed with ``SESSIONREPO_REQUIRE_CITUS=1``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sessionrepo import Message, NotFound, open_async_repository, open_repository

from support.citus_remote import RemoteCommands, assert_one_worker

pytestmark = pytest.mark.citus


def _alone(name: str, commands: list[tuple[str, str]]) -> str:
    """One SELECT of the session's messages, to one worker, nothing around it."""
    worker = assert_one_worker(name, commands)
    assert len(commands) == 1, (name, commands)
    assert commands[0][1].startswith("SELECT "), commands
    assert " messages WHERE " in commands[0][1], commands
    return worker


def test_a_load_is_one_select_on_the_sessions_worker(citus_url: str) -> None:
    sent = [Message(role="user", content=f"m{index}") for index in range(4)]
    with RemoteCommands() as remote, open_repository(citus_url) as repository:
        for other in range(8):  # sessions on both workers
            repository.append(f"other-{other}", [Message(role="user", content="x")])
        repository.append("load-s", sent)
        loads: dict[str, Callable[[], object]] = {
            "whole": lambda: repository.load_transcript("load-s"),
            "page": lambda: repository.load_transcript("load-s", after_seq=1, limit=2),
            "newest page": lambda: repository.load_transcript("load-s", before_seq=4, limit=2),
            "wire form": lambda: repository.load_openai("load-s"),
        }
        seen = {name: remote.during(action) for name, action in loads.items()}
        assert [m.content for m in repository.load_transcript("load-s", after_seq=1, limit=2)] == [
            "m1",
            "m2",
        ]
        assert [m.seq for m in repository.load_transcript("load-s", before_seq=4, limit=2)] == [
            2,
            3,
        ]
        # Nothing stored: the fallback tells an unknown session from an empty page.
        with pytest.raises(NotFound):
            repository.load_transcript("no-such-session")
        assert repository.load_transcript("load-s", after_seq=4) == []
    workers = {name: _alone(name, commands) for name, commands in seen.items()}
    assert len(set(workers.values())) == 1, workers


def test_an_async_load_is_one_select_too(citus_url: str) -> None:
    async def loads() -> list[str]:
        async with await open_async_repository(citus_url) as repository:
            await repository.append("async-load", [Message(role="user", content="a")])
            return [str(m.content) for m in await repository.load_transcript("async-load")]

    loaded: list[list[str]] = []
    with RemoteCommands() as remote:
        commands = remote.during(lambda: loaded.append(asyncio.run(loads())))
    assert loaded == [["a"]]
    selects = [(w, c) for w, c in commands if c.startswith("SELECT ") and " messages WHERE " in c]
    assert len(selects) == 1, commands
    _alone("async load", selects)
    # The append was one call, the load one statement: nothing else was sent.
    assert len(commands) == 2, commands
