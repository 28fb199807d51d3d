"""``import-hermes`` brings the usage Hermes kept (``session_model_usage``, else the
session's own token columns) into the usage ledger, each total counted once: a re-import
adds nothing, a re-import after the session went on adds the difference, on both
backends; the session's totals and ``insights`` follow from the records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionrepo import SessionRepository, open_repository
from sessionrepo.importers.hermes import import_hermes
from sessionrepo.ops.insights import insights

from support.hermes_fixtures import HermesDB, build_v2_state_db

#: Hermes' table as its schema (version 22 and later) creates it.
MODEL_USAGE = """
CREATE TABLE session_model_usage (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    model TEXT NOT NULL,
    billing_provider TEXT NOT NULL DEFAULT '',
    billing_base_url TEXT NOT NULL DEFAULT '',
    billing_mode TEXT NOT NULL DEFAULT '',
    task TEXT NOT NULL DEFAULT '',
    api_call_count INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    estimated_cost_usd REAL NOT NULL DEFAULT 0,
    actual_cost_usd REAL NOT NULL DEFAULT 0,
    cost_status TEXT,
    cost_source TEXT,
    first_seen REAL,
    last_seen REAL,
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode, task)
)"""
#: What Hermes' version-20 upgrade does with a session's own totals.
SEED_FROM_SESSIONS = """
INSERT OR IGNORE INTO session_model_usage (
    session_id, model, billing_provider, billing_base_url, billing_mode, api_call_count,
    input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,
    estimated_cost_usd, actual_cost_usd, first_seen, last_seen)
SELECT id, COALESCE(model, 'unknown'), '', '', '', 0, COALESCE(input_tokens, 0),
    COALESCE(output_tokens, 0), 0, 0, 0, 0, 0, started_at, COALESCE(ended_at, started_at)
FROM sessions WHERE COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0) > 0"""


@pytest.fixture
def store(database_url: str) -> Iterator[SessionRepository]:
    repository = open_repository(database_url)
    yield repository
    repository.close()


def _home(path: Path) -> HermesDB:
    path.mkdir(parents=True)
    db = HermesDB(path / "state.db")
    db.execute("DROP TABLE session_model_usage")
    db.execute(MODEL_USAGE)
    db.session("s1", model="gpt-4.1", input_tokens=1500, output_tokens=300)
    db.message("s1", "user", "hello")
    db.message("s1", "assistant", "hi")
    rows = (
        # model, provider, task, calls, in, out, cached, reasoning, estimated, actual, seen
        ("gpt-4.1", "openai", "", 3, 1500, 300, 400, 20, 0.0042, 0.004, 1_735_722_100.0),
        ("gemini-2.5-flash", "google", "compression", 1, 800, 60, 0, 0, 0.0001, 0.0, None),
    )
    for model, provider, task, calls, tin, tout, cached, thinking, est, act, seen in rows:
        db.execute(
            "INSERT INTO session_model_usage (session_id, model, billing_provider, task, "
            "api_call_count, input_tokens, output_tokens, cache_read_tokens, reasoning_tokens,"
            " estimated_cost_usd, actual_cost_usd, cost_status, first_seen, last_seen) "
            "VALUES ('s1', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'estimated', ?, ?)",
            model,
            provider,
            task,
            calls,
            tin,
            tout,
            cached,
            thinking,
            est,
            act,
            seen,
            seen,
        )
    return db


def test_each_row_becomes_a_record_once_and_a_rerun_adds_only_what_grew(
    store: SessionRepository, tmp_path: Path
) -> None:
    db = _home(tmp_path / "hermes")
    summary = import_hermes(tmp_path / "hermes", store)
    assert (summary.usage_rows_read, summary.usage_records_inserted) == (2, 2)
    records = {r.model: r for r in store.list_usage("s1")}
    gpt, gemini = records["gpt-4.1"], records["gemini-2.5-flash"]
    assert (gpt.input_tokens, gpt.output_tokens, gpt.cache_read_tokens) == (1500, 300, 400)
    assert (gpt.reasoning_tokens, gpt.provider, gpt.reported_cost) == (20, "openai", 0.004)
    assert gpt.occurred_at.timestamp() == pytest.approx(1_735_722_100.0)
    assert gpt.extra is not None
    assert gpt.extra["hermes"]["api_call_count"] == 3
    assert gpt.extra["hermes"]["estimated_cost_usd"] == pytest.approx(0.0042)
    assert gpt.extra["hermes"]["cost_status"] == "estimated"
    # No actual cost: not reported; no last_seen: the session's time.
    assert gemini.reported_cost is None
    assert gemini.extra is not None
    assert gemini.extra["hermes"]["task"] == "compression"
    session = store.get_session("s1")
    assert (session.input_tokens, session.output_tokens) == (2300, 360)  # from the records
    assert session.metadata["hermes"]["input_tokens"] == 1500  # Hermes' own column, kept

    again = import_hermes(tmp_path / "hermes", store)
    assert (again.usage_rows_read, again.usage_records_inserted) == (2, 0)
    assert len(store.list_usage("s1")) == 2

    # The session went on: Hermes' running total grew by one call.
    db.execute(
        "UPDATE session_model_usage SET api_call_count = 4, input_tokens = 1700, "
        "output_tokens = 340, actual_cost_usd = 0.005, last_seen = 1735722200.0 "
        "WHERE model = 'gpt-4.1'"
    )
    grown = import_hermes(tmp_path / "hermes", store)
    assert grown.usage_records_inserted == 1
    added = [
        r for r in store.list_usage("s1") if r.model == "gpt-4.1" and r.usage_id != gpt.usage_id
    ]
    assert len(added) == 1
    assert (added[0].input_tokens, added[0].output_tokens) == (200, 40)
    assert added[0].reported_cost == pytest.approx(0.001)
    assert added[0].extra is not None
    assert added[0].extra["hermes"]["api_call_count"] == 1
    assert import_hermes(tmp_path / "hermes", store).usage_records_inserted == 0
    by_model = {r.key: r for r in insights(store, by="model").rows}
    assert (by_model["gpt-4.1"].input_tokens, by_model["gpt-4.1"].output_tokens) == (1700, 340)
    assert by_model["gpt-4.1"].reported_cost == pytest.approx(0.005)
    assert by_model["gemini-2.5-flash"].input_tokens == 800
    assert store.get_session("s1").input_tokens == 2500
    db.close()


def test_a_row_that_shrank_is_reported_and_nothing_is_subtracted(
    store: SessionRepository, tmp_path: Path
) -> None:
    db = _home(tmp_path / "hermes")
    import_hermes(tmp_path / "hermes", store)
    db.execute("UPDATE session_model_usage SET input_tokens = 10 WHERE model = 'gpt-4.1'")
    summary = import_hermes(tmp_path / "hermes", store)
    assert summary.usage_records_inserted == 0
    assert any("below what an earlier import stored" in n.problem for n in summary.notes)
    assert store.get_session("s1").input_tokens == 2300
    db.close()


def test_an_old_home_brings_the_sessions_totals_and_hermes_upgrade_doubles_nothing(
    store: SessionRepository, tmp_path: Path
) -> None:
    v2 = build_v2_state_db(tmp_path / "old-hermes")
    summary = import_hermes(v2.path, store)
    assert (summary.usage_rows_read, summary.usage_records_inserted) == (0, 1)
    (record,) = store.list_usage(v2.parent)
    assert (record.model, record.input_tokens, record.output_tokens) == ("gpt-4o", 100, 50)
    assert record.provider is None
    assert record.reported_cost is None
    assert store.list_usage(v2.child) == []  # it counted no token
    assert (
        store.get_session(v2.parent).input_tokens,
        store.get_session(v2.parent).output_tokens,
    ) == (100, 50)
    assert import_hermes(v2.path, store).usage_records_inserted == 0
    # Hermes upgrades: its version-20 step seeds session_model_usage from the sessions.
    v2.db.execute(MODEL_USAGE)
    v2.db.execute(SEED_FROM_SESSIONS)
    upgraded = import_hermes(v2.path, store)
    assert (upgraded.usage_rows_read, upgraded.usage_records_inserted) == (1, 0)
    assert [r.usage_id for r in store.list_usage(v2.parent)] == [record.usage_id]
    assert store.get_session(v2.parent).input_tokens == 100
    v2.db.close()


def test_a_table_with_few_columns_is_read_for_what_it_has(
    store: SessionRepository, tmp_path: Path
) -> None:
    """The current fixture's own narrow table (session_id, model, input_tokens)."""
    home = tmp_path / "hermes"
    home.mkdir()
    db = HermesDB(home / "state.db")
    db.session("s2", model="m", input_tokens=5)
    db.message("s2", "user", "x")
    db.execute("INSERT INTO session_model_usage VALUES ('s2', 'm', 7)")
    db.execute("INSERT INTO session_model_usage VALUES ('s2', NULL, 3)")
    summary = import_hermes(home, store)
    assert (summary.usage_rows_read, summary.usage_records_inserted) == (2, 2)
    got = sorted((r.model, r.input_tokens) for r in store.list_usage("s2"))
    assert got == [("m", 7), ("unknown", 3)]
    assert store.get_session("s2").input_tokens == 10
    db.close()
