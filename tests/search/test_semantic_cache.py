"""The vectors a repository keeps in memory between semantic searches
(:class:`sessionrepo.store.semantic.VectorCache`), on both backends and both APIs: loaded
once, brought up to date from the rows written since (by this repository or another),
and never the source of a hit that is no longer the message embedded (erased, retracted,
edited by compaction, re-embedded); bounded in bytes, ``0`` off, the same answers off."""

from __future__ import annotations

import tracemalloc
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from sessionrepo import open_repository
from sessionrepo.models.privacy import RetentionPolicy
from sessionrepo.models.tables import embeddings_table
from sessionrepo.search.query import SearchFilters
from sessionrepo.store import searching as searching_module
from sessionrepo.store import semantic as semantic_module
from sessionrepo.store.semantic import VectorCache
from tests.conftest import open_for_api

from support.embedders import ConceptEmbedder


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _open(url: str, api: str, request: pytest.FixtureRequest, **options: Any) -> Any:
    options.setdefault("embedder", ConceptEmbedder())
    return open_for_api(url, api, request, **options)


def _cache(store: Any) -> VectorCache:
    """The repository's cache (the async facade's repository underneath)."""
    inner = getattr(store, "_target", store)  # BlockingAsync
    inner = getattr(inner, "_sync", inner)  # AsyncSessionRepository
    cache = inner._semantic.vectors
    assert isinstance(cache, VectorCache)
    return cache


def _keys(hits: Any) -> list[tuple[str, int]]:
    return [(h.session_id, h.seq) for h in hits]


def _fill(store: Any) -> None:
    store.append(
        "trip",
        [
            {"role": "user", "content": "Should I buy the JR Pass before Shinjuku?"},
            {"role": "assistant", "content": "Yes, it pays off if you go to Kyoto."},
        ],
        source="discord",
        user_id="ana",
    )
    store.append(
        "pet",
        [{"role": "user", "content": "Mochi is sick, we go to the vet tomorrow"}],
        source="telegram",
        user_id="bo",
    )
    store.append(
        "db",
        [{"role": "user", "content": "why is my postgres query slow without an index"}],
        source="discord",
        user_id="ana",
    )


@pytest.fixture
def no_search_catch_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Searches embed nothing themselves: what they find was embedded before."""
    monkeypatch.setattr(searching_module, "SEARCH_CATCH_UP", 0)


def test_loaded_once_then_kept_up_from_what_others_write(
    database_url: str, api: str, request: pytest.FixtureRequest, no_search_catch_up: None
) -> None:
    store = _open(database_url, api, request)
    other = _open(database_url, "sync", request)  # another process's repository
    _fill(store)
    store.catch_up_semantic_index()
    assert _keys(store.search("vet", mode="semantic", limit=1)) == [("pet", 1)]
    cache = _cache(store)
    loaded_at, seen = cache.loaded_at, cache.seen
    assert cache.vectors == 4
    assert seen is not None
    other.append("cook", [{"role": "user", "content": "a pasta recipe for dinner"}])
    assert other.catch_up_semantic_index() == 1
    assert _keys(store.search("bake with flour", mode="semantic", limit=1)) == [("cook", 1)]
    assert cache.vectors == 5
    assert cache.loaded_at == loaded_at  # read incrementally, not again whole
    assert cache.seen is not None
    assert cache.seen[0] > seen[0]


def test_a_hit_is_never_an_erased_or_retracted_message(
    database_url: str, api: str, request: pytest.FixtureRequest, no_search_catch_up: None
) -> None:
    store = _open(database_url, api, request)
    other = _open(database_url, "sync", request)
    _fill(store)
    store.catch_up_semantic_index()
    assert ("pet", 1) in _keys(store.search("cat", mode="semantic"))
    kept = _cache(store).vectors
    # Erased by another repository: the rows go with the session; this one's cache still
    # holds the vector, and its check against the database refuses it.
    assert other.erase(session_id="pet").session_ids == ["pet"]
    assert "pet" not in {h.session_id for h in store.search("cat", mode="semantic")}
    assert _cache(store).vectors == kept - 1  # found gone, forgotten
    other.retract("db", [other.load_transcript("db")[0].client_msg_uuid])
    hits = store.search("postgres index", mode="semantic", limit=10)
    assert "db" not in {h.session_id for h in hits}
    assert len(hits) == 2  # the page still filled from what is left


def test_a_retention_run_removes_the_vectors_of_the_messages_it_erases(
    database_url: str, api: str, request: pytest.FixtureRequest
) -> None:
    store = _open(database_url, api, request)
    _fill(store)
    store.catch_up_semantic_index()
    store.retract("pet", [store.load_transcript("pet")[0].client_msg_uuid])
    store.set_retention_policy(RetentionPolicy(source="*", superseded_days=1))
    report = store.apply_retention(now=datetime.now(UTC) + timedelta(days=2))
    assert report.superseded_messages == 1
    plain = open_repository(database_url, embedder=False)
    try:
        left = plain.database.read(
            lambda conn: conn.execute(
                select(embeddings_table.c.session_id).where(embeddings_table.c.session_id == "pet")
            ).all()
        )
    finally:
        plain.close()
    assert left == []  # not an orphan vector of an erased text


def test_a_compaction_never_answers_with_the_old_texts_vector(
    database_url: str, api: str, request: pytest.FixtureRequest, no_search_catch_up: None
) -> None:
    store = _open(database_url, api, request)
    other = _open(database_url, "sync", request)
    store.append(
        "s",
        [
            {"role": "user", "content": "Mochi the kitten is at the vet"},
            {"role": "user", "content": "my postgres query needs an index"},
        ],
    )
    store.catch_up_semantic_index()
    assert _keys(store.search("sql table", mode="semantic", limit=1)) == [("s", 2)]
    # The summary takes seq 2; the postgres message moves to seq 3. Row (s, 2) still holds
    # the postgres text's vector until the catch-up embeds the summary.
    other.compact("s", 1, {"role": "user", "content": "we baked bread in the oven"})
    assert [m.seq for m in other.load_transcript("s")] == [2, 3]
    stale = store.search("sql table", mode="semantic", limit=10)
    assert ("s", 2) not in _keys(stale)  # not the summary, by the postgres text's vector
    assert stale == []  # the moved message has no vector yet; nothing else is current
    assert other.catch_up_semantic_index() == 2
    assert _keys(store.search("sql table", mode="semantic", limit=1)) == [("s", 3)]
    assert _keys(store.search("flour and an oven", mode="semantic", limit=1)) == [("s", 2)]
    hit = store.search("flour and an oven", mode="semantic", limit=1)[0]
    assert "bread" in hit.snippet


def test_a_reindex_starts_the_cache_over(
    database_url: str, api: str, request: pytest.FixtureRequest
) -> None:
    store = _open(database_url, api, request)
    _fill(store)
    store.search("vet", mode="semantic")
    seen = _cache(store).seen
    assert seen is not None
    assert store.reindex_semantic() == 4
    assert _keys(store.search("vet", mode="semantic", limit=1)) == [("pet", 1)]
    after = _cache(store).seen
    assert after is not None
    assert after[1] > seen[1]  # cleared: loaded again whole
    assert _cache(store).vectors == 4


@pytest.mark.parametrize("memory", [0, 2000])
def test_off_or_too_small_gives_the_same_answers(
    database_url: str, api: str, request: pytest.FixtureRequest, memory: int
) -> None:
    kept = _open(database_url, api, request)
    unkept = _open(database_url, api, request, semantic_memory=memory)
    _fill(kept)
    now = datetime.now(UTC)
    for query, filters in (
        ("tokyo", {}),
        ("vet", {"source": "discord"}),
        ("jr pass", {"role": "assistant"}),
        ("kyoto", {"user_id": "ana", "limit": 1, "cursor": 1}),
        ("kyoto", {"session_id": "trip"}),
        ("tokyo", {"since": now - timedelta(hours=1)}),
        ("tokyo", {"until": now - timedelta(hours=1)}),
    ):
        expected = kept.search(query, mode="semantic", **filters)
        assert unkept.search(query, mode="semantic", **filters) == expected, (query, filters)
        assert kept.search(query, mode="hybrid", **filters) == unkept.search(
            query, mode="hybrid", **filters
        )
    assert _cache(kept).vectors == 4
    assert _cache(unkept).seen is None  # nothing kept
    assert _cache(unkept).size <= max(memory, 0) or _cache(unkept).vectors == 0


def test_filters_on_the_cache(database_url: str, api: str, request: pytest.FixtureRequest) -> None:
    store = _open(database_url, api, request)
    _fill(store)
    assert {h.session_id for h in store.search("x", mode="semantic", user_id="ana")} == {
        "trip",
        "db",
    }
    assert {h.session_id for h in store.search("x", mode="semantic", source="telegram")} == {"pet"}
    assert store.search("x", mode="semantic", source="nowhere") == []
    assert store.search("x", mode="semantic", session_id="nobody") == []
    assert store.search("x", mode="semantic", role="tool") == []
    assert {h.role for h in store.search("x", mode="semantic", role="assistant")} == {"assistant"}
    # A session's user filled in later: the filter reads the sessions at each query.
    store.append("late", [{"role": "user", "content": "the vet again"}])
    assert store.search("x", mode="semantic", user_id="cy") == []
    store.create_session("late", user_id="cy")  # fills a user not given before
    assert _keys(store.search("x", mode="semantic", user_id="cy")) == [("late", 1)]


def test_the_bound_counts_what_the_cache_holds() -> None:
    """:attr:`VectorCache.size` is at least what the kept vectors take (tracemalloc)."""
    dimension, count = 64, 20_000
    rng = np.random.default_rng(3)
    vectors = rng.integers(-127, 128, size=(count, dimension), dtype=np.int8)
    stamp = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        (f"session-{i // 50}", i % 50 + 1, bytes(16), vectors[i].tobytes(), "user", stamp)
        for i in range(count)
    ]
    cache = VectorCache()
    cache.dimension = dimension
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cache._append(rows)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert cache.vectors == count
    assert held <= cache.size
    assert cache.size < 2 * held  # and not wildly above it
    target = rng.standard_normal(dimension).astype(np.float32)
    best = cache.best(target, SearchFilters(), None, 5, set())
    scores = vectors.astype(np.float32) @ target
    assert [score for _, score, _ in best] == sorted(scores.tolist(), reverse=True)[:5]


def test_ties_are_in_key_order_at_any_depth() -> None:
    scores = np.array([1.0, 3.0, 3.0, 3.0, 2.0, -np.inf], dtype=np.float32)
    assert sorted(semantic_module._top(scores, 2).tolist()) == [1, 2, 3]
    assert sorted(semantic_module._top(scores, 10).tolist()) == [0, 1, 2, 3, 4]
    assert semantic_module._top(np.full(3, -np.inf, dtype=np.float32), 2).tolist() == []


def _inner(store: Any) -> Any:
    inner = getattr(store, "_target", store)
    return getattr(inner, "_sync", inner)


def test_without_direct_reads_the_same_answers(
    database_url: str, api: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dialect without ``select_direct`` (Citus) reads the state, the vectors and the
    hits through SQLAlchemy, the catch-up asking its own question: the same answers."""
    direct = _open(database_url, api, request)
    _fill(direct)
    now = datetime.now(UTC)
    queries: list[tuple[str, dict[str, Any]]] = [
        ("tokyo", {}),
        ("vet", {"source": "discord"}),
        ("jr pass", {"role": "assistant"}),
        ("kyoto", {"user_id": "ana", "limit": 1, "cursor": 1}),
        ("tokyo", {"since": now - timedelta(hours=1)}),
        ("tokyo", {"until": now - timedelta(hours=1)}),
    ]
    expected = [direct.search(q, mode="semantic", **filters) for q, filters in queries]
    assert expected[0]
    assert not expected[-1]
    monkeypatch.setattr(type(_inner(direct)._db.dialect), "select_direct", lambda self, *args: None)
    routed = _open(database_url, api, request)
    assert [routed.search(q, mode="semantic", **filters) for q, filters in queries] == expected
    assert _cache(routed).vectors == 4
    routed.append("cook", [{"role": "user", "content": "a pasta recipe for dinner"}])
    assert _keys(routed.search("bake with flour", mode="semantic", limit=1)) == [("cook", 1)]


def test_a_search_with_nothing_behind_asks_no_more(
    database_url: str, api: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state's read answers whether any session is behind: with none, a search's
    catch-up reads no sessions; a message appended since is still embedded and found."""
    calls: list[Any] = []
    behind = semantic_module._sessions_behind

    def counted(conn: Any, watermark: Any) -> Any:
        calls.append(watermark)
        return behind(conn, watermark)

    monkeypatch.setattr(semantic_module, "_sessions_behind", counted)
    store = _open(database_url, api, request)
    _fill(store)
    store.catch_up_semantic_index()
    calls.clear()
    for _ in range(3):
        assert _keys(store.search("vet", mode="semantic", limit=1)) == [("pet", 1)]
    assert calls == []
    store.append("cook", [{"role": "user", "content": "a pasta recipe for dinner"}])
    assert _keys(store.search("bake with flour", mode="semantic", limit=1)) == [("cook", 1)]
    assert len(calls) == 1  # the session behind read, then nothing more


def test_times_are_read_as_the_column_types_read_them() -> None:
    """The load's timestamps (microseconds since the epoch): SQLite's text parsed at
    once by numpy, anything else one by one, the same values either way."""
    moments = [
        datetime(2026, 1, 1, tzinfo=UTC),
        datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ]
    epoch, micro = datetime(1970, 1, 1, tzinfo=UTC), timedelta(microseconds=1)
    expected = [(m - epoch) // micro for m in moments]
    texts = [m.replace(tzinfo=None).isoformat(" ", "microseconds") for m in moments]
    assert semantic_module._stamps(texts).tolist() == expected
    assert semantic_module._stamps(moments).tolist() == expected
    eastern = timezone(timedelta(hours=-5))
    assert semantic_module._stamps([m.astimezone(eastern) for m in moments]).tolist() == expected
    assert semantic_module._stamps([texts[0][:19], *texts[1:]]).tolist() == expected  # short
    assert semantic_module.stored_time(texts[1]) == moments[1]
