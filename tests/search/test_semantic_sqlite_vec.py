"""Search by meaning through sqlite-vec (``sessionrepo.dialects.sqlite.vectors``), on
SQLite, both APIs. Where this Python's ``sqlite3`` can load it (``make test-sqlite-vec``
runs these on such a Python): a query whose vectors are not kept in memory is answered by
it with the exact scan's hits, every filter included; what it still reads of a retracted
or erased message is never a hit; a store of another dimension is scanned by it too. On
any Python: where it cannot load (no package, no extension loading, the load refused) the
search scans as without it, and says nothing but a warning for a load that failed."""

from __future__ import annotations

import logging
import sqlite3
import sys
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sessionrepo.dialects.sqlite import vectors as vectors_module
from sessionrepo.dialects.sqlite.vectors import SQLiteVectors, load_sqlite_vec
from tests.conftest import open_for_api

from support.embedders import ConceptEmbedder
from support.vector_spy import NearestSpy


def _sqlite_vec_missing() -> str | None:
    """Why sqlite-vec cannot load in this Python, or ``None``."""
    if not hasattr(sqlite3.Connection, "enable_load_extension"):
        return (
            "this Python's sqlite3 is built without extension loading "
            "(make test-sqlite-vec runs these on one that has it)"
        )
    try:
        import sqlite_vec  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return "the sqlite-vec package is not installed (pip install 'sessionrepo[sqlite-vec]')"
    return None


@pytest.fixture
def vec_url(tmp_path: Path) -> str:
    missing = _sqlite_vec_missing()
    if missing is not None:
        pytest.skip(missing)
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


_TEXTS = [
    ("trip", "discord", "Should I buy the JR Pass before Shinjuku?"),
    ("trip", "discord", "Yes if you go on to Kyoto and stay in a ryokan."),
    ("pet", "telegram", "Mochi is sick, we go to the vet tomorrow"),
    ("pet", "telegram", "the kitten will be fine"),
    ("db", "discord", "why is my postgres query slow without an index"),
    ("cook", "telegram", "bake the flour in a hot oven for dinner"),
]


def _fill(store: Any) -> None:
    for session, source, content in _TEXTS:
        store.append(session, [{"role": "user", "content": content}], source=source, user_id="ana")
    for number in range(40):  # more than a page of near vectors
        even = number % 2 == 0
        store.append(
            f"noise{number}",
            [{"role": "user" if even else "assistant", "content": f"word{number} x vet trip"}],
            user_id="ana" if even else "bo",
        )
    store.catch_up_semantic_index()


def _keys(hits: Any) -> list[tuple[str, int]]:
    return [(hit.session_id, hit.seq) for hit in hits]


def _ranked(hits: Any) -> list[tuple[float, str, int]]:
    return [(round(hit.rank, 6), hit.session_id, hit.seq) for hit in hits]


_QUERIES = ("planning a trip to japan", "my feline is unwell", "cooking pasta", "the vet")


def _filters() -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    return [
        {},
        {"session_id": "pet"},
        {"user_id": "ana"},
        {"user_id": "bo"},
        {"role": "assistant"},
        {"source": "telegram"},
        {"since": now - timedelta(hours=1), "until": now + timedelta(hours=1)},
        {"until": now - timedelta(hours=1)},  # nothing before: an empty answer
        {"user_id": "ana", "role": "user", "source": "discord"},
    ]


def test_an_uncached_query_is_answered_by_sqlite_vec_with_the_exact_hits(
    vec_url: str, api: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedder = ConceptEmbedder(dimension=512)
    exact = open_for_api(vec_url, api, request, embedder=embedder)  # vectors kept in memory
    _fill(exact)
    spy = NearestSpy(monkeypatch, SQLiteVectors)
    expected = exact.search("planning a trip to japan", mode="semantic", limit=5)
    assert spy.answers == []  # kept in memory: scanned there, sqlite-vec not asked
    scanned = open_for_api(vec_url, api, request, embedder=embedder, semantic_memory=0)
    for filters in _filters():
        for query in _QUERIES:
            hits = scanned.search(query, mode="semantic", limit=5, **filters)
            truth = exact.search(query, mode="semantic", limit=5, **filters)
            assert _ranked(hits) == _ranked(truth), (query, filters)
    assert spy.answers
    assert all(answer is not None for answer in spy.answers)
    assert _keys(expected)[:2] in ([("trip", 1), ("trip", 2)], [("trip", 2), ("trip", 1)])
    # Paging and hybrid go through it too.
    second = scanned.search("planning a trip to japan", mode="semantic", limit=2, cursor=2)
    assert _keys(second) == _keys(expected)[2:4]
    assert ("trip", 1) in _keys(scanned.search("tokyo trip", mode="hybrid", limit=5))


def test_what_it_still_reads_of_a_retracted_or_erased_message_is_never_a_hit(
    vec_url: str, api: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_for_api(
        vec_url, api, request, embedder=ConceptEmbedder(dimension=512), semantic_memory=0
    )
    _fill(store)
    spy = NearestSpy(monkeypatch, SQLiteVectors)
    assert _keys(store.search("sick cat at the vet", mode="semantic", limit=2))[0][0] == "pet"
    store.retract("pet", [store.load_transcript("pet")[0].client_msg_uuid])
    hits = store.search("sick cat at the vet", mode="semantic", limit=3)
    assert ("pet", 1) not in _keys(hits)
    assert ("pet", 2) in _keys(hits)  # the session's other message still found
    store.erase(session_id="pet")
    assert "pet" not in {h.session_id for h in store.search("kitten vet", mode="semantic")}
    assert spy.answers
    assert all(answer is not None for answer in spy.answers)


def test_a_store_of_any_dimension_is_scanned_by_it(
    vec_url: str, api: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_for_api(vec_url, api, request, embedder=ConceptEmbedder(), semantic_memory=0)
    _fill(store)
    spy = NearestSpy(monkeypatch, SQLiteVectors)
    hits = store.search("planning a trip to japan", mode="semantic", limit=2)
    assert {h.session_id for h in hits} == {"trip"}
    assert len(spy.answers) == 1
    assert spy.answers[0] is not None


def test_where_it_cannot_load_the_query_scans_as_without_it(
    tmp_path: Path, api: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On every Python: here it is refused as it is where the package is absent.
    monkeypatch.setitem(sys.modules, "sqlite_vec", None)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    embedder = ConceptEmbedder(dimension=512)
    exact = open_for_api(url, api, request, embedder=embedder)
    _fill(exact)
    spy = NearestSpy(monkeypatch, SQLiteVectors)
    scanned = open_for_api(url, api, request, embedder=embedder, semantic_memory=0)
    for filters in ({}, {"user_id": "ana"}, {"role": "user"}):
        hits = scanned.search("my feline is unwell", mode="semantic", limit=5, **filters)
        truth = exact.search("my feline is unwell", mode="semantic", limit=5, **filters)
        assert _ranked(hits) == _ranked(truth)
    assert spy.answers
    assert all(answer is None for answer in spy.answers)


@pytest.fixture
def connection() -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(":memory:")
    yield conn
    conn.close()


def test_it_loads_exactly_where_this_python_can_load_it(connection: sqlite3.Connection) -> None:
    version = load_sqlite_vec(connection)
    if _sqlite_vec_missing() is None:
        assert version is not None
        assert version.startswith("v")
        assert connection.execute("SELECT vec_version()").fetchone() == (version,)
        # Loading is switched off again: SQL cannot load another extension.
        with pytest.raises(sqlite3.OperationalError, match="not authorized"):
            connection.execute("SELECT load_extension('/nonexistent')").fetchone()
    else:
        assert version is None
    assert load_sqlite_vec(object()) is None  # not sqlite3's driver (aiosqlite's wrapper)


def test_a_load_that_fails_is_a_warning_and_no_sqlite_vec(
    connection: sqlite3.Connection,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if not hasattr(connection, "enable_load_extension"):
        pytest.skip("this Python's sqlite3 cannot load extensions: it never tries")
    broken = types.ModuleType("sqlite_vec")

    def load(conn: sqlite3.Connection) -> None:
        conn.load_extension("/nonexistent/vec0")

    broken.load = load  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sqlite_vec", broken)
    with caplog.at_level(logging.WARNING, logger=vectors_module.__name__):
        assert load_sqlite_vec(connection) is None
    assert "did not load" in caplog.text
    with pytest.raises(sqlite3.OperationalError, match="not authorized"):  # loading off again
        connection.execute("SELECT load_extension('/nonexistent')").fetchone()
