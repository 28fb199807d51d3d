"""Search by meaning (``mode="semantic"`` / ``"hybrid"``) on both backends and both APIs,
with a deterministic embedder (tests/support/embedders.py): vectors are made by the
catch-up, never by the append; edits and erasure take messages out; a store never mixes
two models; hybrid says when vectors are missing and still returns the keyword hits."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from sessionrepo import (
    CallableEmbedder,
    SearchResults,
    SemanticSearchUnavailable,
    open_repository,
)
from sessionrepo.models.tables import embeddings_table
from sessionrepo.store import semantic as semantic_module
from tests.conftest import open_for_api

from support.embedders import ConceptEmbedder


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def embedder() -> ConceptEmbedder:
    return ConceptEmbedder()


_open = open_for_api


@pytest.fixture
def store(
    database_url: str, api: str, embedder: ConceptEmbedder, request: pytest.FixtureRequest
) -> Any:
    return _open(database_url, api, request, embedder=embedder)


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
        [
            {"role": "system", "content": "You are a Tokyo travel agent"},  # never embedded
            {"role": "user", "content": "why is my postgres query slow without an index"},
        ],
        source="discord",
        user_id="ana",
    )


def _rows(database_url: str) -> int:
    repository = open_repository(database_url, embedder=False)
    try:
        return int(
            repository.database.read(
                lambda conn: conn.execute(
                    select(func.count())
                    .select_from(embeddings_table)
                    .where(embeddings_table.c.vector.is_not(None))
                ).scalar_one()
            )
        )
    finally:
        repository.close()


def test_finds_by_meaning_what_keywords_miss(store: Any, embedder: ConceptEmbedder) -> None:
    _fill(store)
    assert embedder.texts == 0  # the append embeds nothing
    assert store.search("planning the tokyo trip") == []  # keyword: no such words stored
    hits = store.search("planning the tokyo trip", mode="semantic", limit=3)
    assert isinstance(hits, SearchResults)
    assert hits.complete
    assert hits.notice is None
    assert [(h.session_id, h.seq) for h in hits[:2]] == [("trip", 1), ("trip", 2)] or [
        (h.session_id, h.seq) for h in hits[:2]
    ] == [("trip", 2), ("trip", 1)]
    assert hits[0].rank > hits[-1].rank
    assert hits[0].snippet  # the message's beginning when no query word occurs
    # The system prompt that says "Tokyo" was never embedded.
    assert ("db", 1) not in {(h.session_id, h.seq) for h in store.search("tokyo", mode="semantic")}
    assert embedder.texts == 4 + 2  # four messages once, and the two queries
    store.search("tokyo", mode="semantic", cursor=1)
    assert embedder.texts == 4 + 2  # caught up, and the query's vector is remembered
    store.search("kyoto", mode="semantic")
    assert embedder.texts == 4 + 3  # a new query: only it


def test_filters_and_paging(store: Any) -> None:
    _fill(store)
    found = store.search("sick cat at the vet", mode="semantic", source="discord")
    assert found
    assert all(h.source == "discord" for h in found)
    assert all(h.user_id == "ana" for h in store.search("x y", mode="semantic", user_id="ana"))
    assert {h.session_id for h in store.search("kyoto", mode="semantic", session_id="pet")} == {
        "pet"
    }
    assert all(h.role == "assistant" for h in store.search("jr", mode="semantic", role="assistant"))
    everything = store.search("tokyo", mode="semantic", limit=10)
    assert len(everything) == 4
    now = datetime.now(UTC)
    assert len(store.search("tokyo", mode="semantic", since=now - timedelta(hours=1))) == 4
    assert store.search("tokyo", mode="semantic", since=now + timedelta(hours=1)) == []
    assert store.search("tokyo", mode="semantic", until=now - timedelta(hours=1)) == []
    pages = store.search("tokyo", mode="semantic", limit=2) + store.search(
        "tokyo", mode="semantic", limit=2, cursor=2
    )
    assert [(h.session_id, h.seq) for h in pages] == [(h.session_id, h.seq) for h in everything]


def test_hybrid_keeps_exact_words_first_and_adds_meaning(store: Any) -> None:
    _fill(store)
    hits = store.search("vet", mode="hybrid")
    assert (hits[0].session_id, hits[0].seq) == ("pet", 1)
    assert any(matched for _, matched in hits[0].snippet_parts)
    meaning = store.search("japan trip", mode="hybrid")
    assert meaning[0].session_id == "trip"  # no keyword hit at all: semantic alone


def test_edits_take_messages_out_and_changes_are_embedded_again(
    store: Any, embedder: ConceptEmbedder
) -> None:
    _fill(store)
    assert store.search("vet", mode="semantic")[0].session_id == "pet"
    store.retract("pet", [store.load_transcript("pet")[0].client_msg_uuid])
    assert "pet" not in {h.session_id for h in store.search("vet cat", mode="semantic")}
    store.append("pet", [{"role": "user", "content": "the kitten is fine now"}])
    hits = store.search("feline health", mode="semantic")
    assert (hits[0].session_id, hits[0].seq) == ("pet", 2)


def test_never_mixes_two_models(
    database_url: str, api: str, store: Any, request: pytest.FixtureRequest
) -> None:
    _fill(store)
    store.search("vet", mode="semantic")
    other = _open(database_url, api, request, embedder=ConceptEmbedder(name="test-concepts-v2"))
    with pytest.raises(SemanticSearchUnavailable, match="reindex --semantic"):
        other.search("vet", mode="semantic")
    degraded = other.search("vet", mode="hybrid")  # keyword hits, saying why
    assert [h.session_id for h in degraded] == ["pet"]
    assert not degraded.complete
    assert "test-concepts-v1" in (degraded.notice or "")
    assert other.catch_up_semantic_index() == 0  # nothing embedded with the other model
    seen: list[tuple[int, int]] = []
    assert other.reindex_semantic(progress=lambda done, total: seen.append((done, total))) == 4
    assert seen
    assert seen[-1][1] == 5  # every stored message looked at (the system one too)
    assert other.semantic_index_state()["model"] == "test-concepts-v2"
    assert other.search("vet", mode="semantic")[0].session_id == "pet"
    with pytest.raises(SemanticSearchUnavailable):
        store.search("vet", mode="semantic")  # now the first one is the other model


def test_no_embedder(database_url: str, api: str, request: pytest.FixtureRequest) -> None:
    plain = _open(database_url, api, request, embedder=False)
    plain.append("pet", [{"role": "user", "content": "Mochi at the vet"}])
    with pytest.raises(SemanticSearchUnavailable, match="semantic extra"):
        plain.search("vet", mode="semantic")
    hits = plain.search("vet", mode="hybrid")
    assert [h.session_id for h in hits] == ["pet"]
    assert not hits.complete
    assert plain.search("vet")[0].session_id == "pet"  # keyword: unchanged
    assert plain.catch_up_semantic_index() == 0


def test_search_catch_up_is_bounded_and_says_so(
    store: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(semantic_module, "CATCH_UP_SESSIONS", 2)
    store.append("many", [{"role": "user", "content": f"recipe {i} for pasta"} for i in range(5)])
    import sessionrepo.store.searching as searching_module

    monkeypatch.setattr(searching_module, "SEARCH_CATCH_UP", 2)
    first = store.search("cook dinner", mode="hybrid")
    assert not first.complete
    assert "no vectors yet" in (first.notice or "")
    assert store.catch_up_semantic_index() == 3
    assert _rows(database_url) == 5
    assert store.search("cook dinner", mode="hybrid").complete


def test_erasing_a_session_removes_its_vectors(store: Any, database_url: str) -> None:
    _fill(store)
    store.catch_up_semantic_index()
    assert _rows(database_url) == 4
    repository = open_repository(database_url, embedder=False)
    try:
        repository.database.write(
            lambda conn: conn.exec_driver_sql("DELETE FROM sessions WHERE id = 'pet'")
        )
    finally:
        repository.close()
    assert _rows(database_url) == 3  # ON DELETE CASCADE


def test_bad_arguments_are_refused_before_anything_runs(store: Any, database_url: str) -> None:
    with pytest.raises(ValueError, match="mode"):
        store.search("x", mode="vector")
    with pytest.raises(TypeError, match="embedder"):
        open_repository(database_url, embedder="minilm")


def test_a_wrong_vector_from_the_embedder_writes_nothing(database_url: str) -> None:
    broken = CallableEmbedder("broken", 8, lambda texts: [[1.0, 2.0] for _ in texts])
    repository = open_repository(database_url, embedder=broken)
    try:
        repository.append("s", [{"role": "user", "content": "hello there"}])
        with pytest.raises(ValueError, match="not 8"):
            repository.catch_up_semantic_index()
    finally:
        repository.close()
    assert _rows(database_url) == 0


def test_quantized_vectors_keep_the_cosine() -> None:
    import numpy as np

    rng = np.random.default_rng(7)
    a, b = rng.normal(size=512), rng.normal(size=512)
    qa = np.frombuffer(semantic_module.quantize(a, 512), dtype=np.int8).astype(np.int32)
    qb = np.frombuffer(semantic_module.quantize(b, 512), dtype=np.int8).astype(np.int32)
    cosine = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    assert abs(int(qa @ qb) / 127**2 - cosine) < 0.02
    assert semantic_module.quantize(np.zeros(4), 4) == bytes(4)
    with pytest.raises(ValueError, match="NaN"):
        semantic_module.quantize([float("nan")] * 4, 4)


def test_the_writers_drainer_fills_the_vectors(database_url: str) -> None:
    from sessionrepo import TranscriptWriter

    from support.polling import eventually

    embedder = ConceptEmbedder()
    repository = open_repository(database_url, embedder=embedder)
    writer = TranscriptWriter(repository)
    try:
        assert writer.write("pet", [{"role": "user", "content": "Mochi at the vet"}]).status == (
            "stored"
        )
        assert embedder.texts == 0  # the write embedded nothing
        writer.start(interval=0.05)
        eventually(lambda: _rows(database_url) == 1, "the drainer's semantic catch-up")
    finally:
        writer.close()
        repository.close()


class _RecordingEmbedder(ConceptEmbedder):
    """Each call's size, to check how much one drainer round embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.sizes.append(len(texts))
        return super().embed(texts)


def test_the_writers_drainer_embeds_only_while_writes_pause(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The semantic catch-up embeds on the writer's process: none while writes are
    flowing (a write less recent than the threshold: 0.25 s, 1 s here so that a slow
    write on a busy machine still counts), then at most one embedder call of 64 texts
    per round until every message has its vector."""
    from sessionrepo import TranscriptWriter
    from sessionrepo.outbox import drain

    from support.polling import eventually

    monkeypatch.setattr(drain, "_WRITES_FLOWING", 1.0)
    embedder = _RecordingEmbedder()
    repository = open_repository(database_url, embedder=embedder)
    writer = TranscriptWriter(repository)
    try:
        # 150 messages stored before the drainer starts: each write is recent when
        # its first round runs.
        for index in range(30):
            batch = [
                {"role": "user", "content": f"Mochi at the vet, day {index} {n}"} for n in range(5)
            ]
            assert writer.write("pet", batch).status == "stored"
        writer.start(interval=0.05)
        for index in range(15):  # writes flowing for about 0.6 s: rounds run, embed nothing
            assert writer.write(
                "pet", [{"role": "user", "content": f"still sick {index}"}]
            ).status == ("stored")
            time.sleep(0.04)
        assert embedder.texts == 0
        eventually(lambda: _rows(database_url) == 165, "the drainer's semantic catch-up")
        assert embedder.sizes
        assert max(embedder.sizes) <= 64
        assert len(embedder.sizes) >= 3  # 165 messages in rounds of at most 64
    finally:
        writer.close()
        repository.close()
