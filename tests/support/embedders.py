"""A deterministic embedder for the tests: words map to concepts, a text's vector is
the count of each concept among its words (plus a small per-word component, so that
texts of no known concept are not all equal). Paraphrases that share no word share a
concept: what search by meaning finds and keyword search does not."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

CONCEPTS: dict[str, tuple[str, ...]] = {
    "japan_trip": ("tokyo", "shinjuku", "jr", "pass", "kyoto", "japan", "trip", "ryokan"),
    "cat_health": ("cat", "vet", "mochi", "kitten", "feline", "sick", "pet"),
    "database": ("postgres", "sql", "index", "query", "database", "vacuum", "table"),
    "cooking": ("recipe", "bake", "oven", "flour", "dinner", "pasta", "cook"),
}
_WORD = re.compile(r"\w+")


class ConceptEmbedder:
    """Deterministic, 16 dimensions: 4 concepts and 12 hashed word buckets."""

    def __init__(self, name: str = "test-concepts-v1", dimension: int = 16) -> None:
        self.name = name
        self.dimension = dimension
        self.calls = 0
        self.texts = 0
        self._concept = {word: i for i, words in enumerate(CONCEPTS.values()) for word in words}

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        self.texts += len(texts)
        vectors = []
        for text in texts:
            vector = [0.0] * self.dimension
            for word in _WORD.findall(text.lower()):
                concept = self._concept.get(word)
                if concept is not None:
                    vector[concept] += 1.0
                else:
                    bucket = 4 + hashlib.sha256(word.encode()).digest()[0] % (self.dimension - 4)
                    vector[bucket] += 0.2
            vectors.append(vector)
        return vectors
