"""The console's search toggle: words (the default), words and meaning, meaning; the
notice of a hybrid search that lacked vectors is shown, and paging keeps the mode."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from sessionrepo import open_repository
from sessionrepo.web import create_app

from support.embedders import ConceptEmbedder


def test_the_console_searches_by_meaning(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    repository = open_repository(url, embedder=ConceptEmbedder())
    repository.append("trip", [{"role": "user", "content": "JR Pass for Shinjuku?"}])
    repository.append(
        "pet", [{"role": "user", "content": f"Mochi vet visit {i}"} for i in range(30)]
    )
    try:
        with TestClient(create_app(repository, url=url), base_url="http://127.0.0.1") as client:
            words = client.get("/search", params={"q": "japan trip"})
            assert 'id="no-hits"' in words.text  # keyword: not the words
            meaning = client.get("/search", params={"q": "japan trip", "mode": "hybrid"})
            assert meaning.status_code == 200
            assert 'data-session="trip"' in meaning.text
            assert '<option value="hybrid" selected>' in meaning.text
            paged = client.get("/search", params={"q": "cat", "mode": "semantic"})
            assert "mode=semantic" in paged.text  # the next page keeps the mode
        plain = open_repository(url, embedder=False)
        try:
            with TestClient(create_app(plain, url=url), base_url="http://127.0.0.1") as client:
                degraded = client.get("/search", params={"q": "vet", "mode": "hybrid"})
                assert 'id="search-notice"' in degraded.text
                assert "semantic extra" in degraded.text
                assert 'data-session="pet"' in degraded.text  # keyword hits still
        finally:
            plain.close()
    finally:
        repository.close()
