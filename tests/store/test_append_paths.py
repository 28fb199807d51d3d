"""The two ways an append goes (``sessionrepo.store.append``), and the switch the contract
suite uses to run its append tests on each (``tests/conftest.py``: ``append_path``).

The guarantees are the contract suite's (``test_append``, ``test_boundary``,
``test_faithful_storage``, ``test_concurrency`` run on ``direct`` and ``locked``); here,
that each id means the path it names.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import take_path

from sessionrepo import Message, SessionRepository, open_repository


@pytest.fixture
def store(database_url: str) -> Iterator[SessionRepository]:
    repository = open_repository(database_url)
    yield repository
    repository.close()


@pytest.mark.parametrize("append_path", ["direct", "locked"])
def test_each_path_is_the_one_it_names(
    store: SessionRepository, append_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dialect = store.database.dialect
    direct_calls: list[str] = []
    original = dialect.append_direct

    def watched(driver: Any, append: Any) -> Any:
        direct_calls.append(append.session_id)
        return original(driver, append)

    monkeypatch.setattr(dialect, "append_direct", watched)
    take_path(store, append_path)
    first, second = Message(role="user", content="one"), Message(role="user", content="two")
    assert store.append("s", [first]).first_seq == 1
    again = store.append("s", [first, second])
    assert (again.duplicates, again.inserted) == ([first.client_msg_uuid], [second.client_msg_uuid])
    assert store.get_session("s").message_count == 2
    assert direct_calls == (["s", "s"] if append_path == "direct" else [])
