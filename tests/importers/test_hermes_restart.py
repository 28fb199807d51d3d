"""A Hermes restart between two imports stores nothing twice, whatever kind of spool
payload it replayed, in the root home and in a profile, on both backends.

The sequence: import, import again, Hermes restarts (replays its spool into ``state.db``,
a version 31 gateway minting a ``message_uid`` for each replayed message that has none,
and deletes the files), import again. The third import finds each replayed message as a
row under a uid the earlier imports never saw; it must recognise it as the message it
stored from the spool, not insert it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sessionrepo import SessionRepository, StoredMessage, open_repository
from sessionrepo.cli.hermes import import_hermes as command
from sessionrepo.importers.hermes import HermesImportReport

from support.hermes_fixtures import HermesDB, Spool, conversation, hermes_restart, hermes_view, uid


@dataclass
class Home:
    """One Hermes home of the test (the root, or the profile ``work``)."""

    path: Path
    session_id: str
    session_key: str
    #: Epoch seconds after every row, for the payloads' ``ts``.
    ts: int


def build_homes(root: Path) -> dict[str, Home]:
    """A version 31 root home and its profile ``work``, one session each, with a tool call
    in the root's and an answer in each that a spooled message will repeat."""
    homes = {}
    for name, path in (("root", root), ("profile", root / "profiles" / "work")):
        path.mkdir(parents=True)
        db = HermesDB(path / "state.db")
        key = f"agent:{name}:dm:1"
        sid = db.session(f"{name}_20250105_0900", source="slack", session_key=key)
        db.message(sid, "user", f"hello from {name}")
        db.message(
            sid,
            "assistant",
            None,
            tool_calls=[
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                }
            ],
        )
        db.message(sid, "tool", "42", tool_call_id="call_1", tool_name="lookup")
        db.message(sid, "assistant", "ok")
        homes[name] = Home(path=path, session_id=sid, session_key=key, ts=int(db.clock) + 60)
        db.close()
    return homes


# -- one scenario per spool kind: what it writes into the home's spool --------------------


def shutdown_pending(spool: Spool, home: Home) -> None:
    """Kind 1, routed by its session_key (no data.session_id)."""
    spool.shutdown_pending(home.session_key, "are you still there?", home.ts, platform="slack")


def shutdown_pending_with_session(spool: Spool, home: Home) -> None:
    """Kind 1 naming its session, with text a row of the session has too."""
    spool.shutdown_pending(home.session_key, "ok", home.ts, session_id=home.session_id)


def overflow_tail(spool: Spool, home: Home) -> None:
    """Kind 2: two queued lines of one ts, ordered by seq (not by file name)."""
    spool.overflow_tail(home.session_key, "second line", home.ts, seq=1)
    spool.overflow_tail(home.session_key, "first line", home.ts, seq=0)


def cap_drop_user(spool: Spool, home: Home) -> None:
    """Kind 3 without a uid: a user text."""
    spool.cap_drop(home.session_id, {"role": "user", "content": "a user text"}, home.ts, 1)


def cap_drop_tool_exchange(spool: Spool, home: Home) -> None:
    """Kind 3 without a uid: a tool call, its result, and an answer equal to a row's."""
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"q": "y"}'},
            }
        ],
        "reasoning": "look it up",
    }
    result = {"role": "tool", "content": "43", "tool_call_id": "call_2", "name": "lookup"}
    spool.cap_drop(home.session_id, call, home.ts, 1)
    spool.cap_drop(home.session_id, result, home.ts + 1, 2)
    spool.cap_drop(home.session_id, {"role": "assistant", "content": "ok"}, home.ts + 2, 3)


def cap_drop_own_timestamp(spool: Spool, home: Home) -> None:
    """Kind 3 without a uid, dated by its own timestamp (epoch seconds, then ISO text)."""
    own = {"role": "user", "content": "dated", "timestamp": home.ts - 0.25}
    spool.cap_drop(home.session_id, own, home.ts, 1)
    iso = {"role": "user", "content": "dated in ISO", "timestamp": "2025-01-05T09:30:00+00:00"}
    spool.cap_drop(home.session_id, iso, home.ts + 1, 2)


def cap_drop_with_uid(spool: Spool, home: Home) -> None:
    """Kind 3 with its uid: the replay keeps it."""
    message = {"role": "assistant", "content": "with a uid", "message_uid": uid()}
    spool.cap_drop(home.session_id, message, home.ts, 1)


def cap_drop_with_key(spool: Spool, home: Home) -> None:
    """Kind 3 stamped with a sessionrepo key (and a uid, and without): the key is what it
    was stored under, and Hermes has no column for it."""
    keyed = {"role": "user", "content": "stamped", "client_msg_uuid": str(uuid.uuid4())}
    spool.cap_drop(home.session_id, keyed, home.ts, 1)
    both = {
        "role": "assistant",
        "content": "stamped, with a uid",
        "client_msg_uuid": str(uuid.uuid4()),
        "message_uid": uid(),
    }
    spool.cap_drop(home.session_id, both, home.ts + 1, 2)


def cap_drop_refused(spool: Spool, home: Home) -> None:
    """A kind-3 payload the gateway's database refused (``.json.bad``): never replayed."""
    message = {"role": "assistant", "content": "refused"}
    spool.cap_drop(home.session_id, message, home.ts, 1, name="pending-0bad.json.bad")


def history_dump(spool: Spool, home: Home) -> None:
    """Kind 4: never replayed (left for manual recovery); its unsaved entries are stored."""
    spool.history_dump(
        home.session_id,
        [
            {"role": "user", "content": "persisted before", "_db_persisted": True},
            {"role": "assistant", "content": "unsaved, no uid"},
            {"role": "user", "content": "unsaved, with a uid", "message_uid": uid()},
        ],
    )


#: Each scenario, and how many messages its payloads hold.
SCENARIOS: dict[str, tuple[Callable[[Spool, Home], None], int]] = {
    "kind1": (shutdown_pending, 1),
    "kind1-session-id-equal-text": (shutdown_pending_with_session, 1),
    "kind2": (overflow_tail, 2),
    "kind3-user-text": (cap_drop_user, 1),
    "kind3-tool-exchange": (cap_drop_tool_exchange, 3),
    "kind3-own-timestamp": (cap_drop_own_timestamp, 2),
    "kind3-uid": (cap_drop_with_uid, 1),
    "kind3-sessionrepo-key": (cap_drop_with_key, 2),
    "kind3-refused": (cap_drop_refused, 1),
    "kind4": (history_dump, 2),
}
#: Scenarios whose payloads Hermes' restart replays into state.db.
REPLAYED = {name for name in SCENARIOS if name not in ("kind3-refused", "kind4")}


def run(url: str, root: Path) -> HermesImportReport:
    result = CliRunner().invoke(
        command,
        ["--url", url, "--json", str(root)],
        env={"SESSIONREPO_DATABASE_URL": None, "SESSIONREPO_OUTBOX_URL": None},
    )
    assert result.exit_code == 0, result.output
    return HermesImportReport.model_validate_json(result.stdout)


def inserted(report: HermesImportReport) -> int:
    return sum(home.messages_inserted for home in report.homes)


def stored(repo: SessionRepository, homes: dict[str, Home]) -> dict[str, list[StoredMessage]]:
    return {
        home.session_id: repo.load_transcript(home.session_id, include_retracted=True)
        for home in homes.values()
    }


def presented(message: StoredMessage) -> dict[str, Any]:
    """A stored message as the conversation fields Hermes' reader has."""
    return conversation(message.to_openai()) | {"timestamp": message.timestamp}


@pytest.fixture
def store(database_url: str) -> Any:
    repository = open_repository(database_url)
    yield repository
    repository.close()


@pytest.mark.parametrize("where", ["root", "profile"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_restart_between_imports_stores_nothing_twice(
    scenario: str, where: str, database_url: str, store: SessionRepository, tmp_path: Path
) -> None:
    homes = build_homes(tmp_path / "hermes")
    home = homes[where]
    write, count = SCENARIOS[scenario]
    write(Spool(home.path), home)

    first = run(database_url, tmp_path / "hermes")
    assert inserted(first) == 4 + 4 + count
    assert inserted(run(database_url, tmp_path / "hermes")) == 0
    before = stored(store, homes)

    replayed = hermes_restart(home.path)
    third = run(database_url, tmp_path / "hermes")

    assert inserted(third) == 0, [p.where for h in third.homes for p in h.changed]
    assert sum(h.messages_changed for h in third.homes) == 0
    assert stored(store, homes) == before
    live = store.load_transcript(home.session_id)
    if scenario in REPLAYED:
        assert replayed
        # After the restart the live transcript is what Hermes presents (a message dated
        # by ISO text keeps that time; Hermes' replay dates it by the payload's ts).
        view = hermes_view(home.path / "state.db", home.session_id)
        mine = [presented(m) for m in live]
        if scenario == "kind3-own-timestamp":
            view[-1].pop("timestamp")
            mine[-1].pop("timestamp")
        assert mine == view
        assert third.homes[0 if where == "root" else 1].messages_seen_by_another_route == count
    else:
        assert replayed == []
    # And once more: stable.
    assert inserted(run(database_url, tmp_path / "hermes")) == 0
    assert stored(store, homes) == before
