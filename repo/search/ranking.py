"""Relevance of indexed documents to a query: BM25, computed in Python.

A backend that cannot rank the newest matches cheaply itself (FTS5's ``bm25()`` counts
every match of every term first, for its idf, which for a common word is most of the
table) fetches the documents of those matches and ranks them here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from sessionrepo.search.query import Query

#: BM25's term-frequency saturation and length normalisation.
BM25_K1: Final = 1.2
BM25_B: Final = 0.75


def relevance(query: Query, bodies: Sequence[str]) -> list[float]:
    """BM25 without its idf factor (every document here holds every term) of indexed
    documents (space-separated words) for a query's positive terms; a document's length
    is its length in characters, against the average of ``bodies``."""
    patterns = [
        re.compile(
            " "  # a literal first: the regex engine then skips ahead to candidates
            + " +".join(re.escape(word) for word in term.words)
            + ("" if term.prefix else "(?= )")
        )
        for term in query.positive
    ]
    average = max(1.0, sum(map(len, bodies)) / max(1, len(bodies)))
    scores: list[float] = []
    for body in bodies:
        padded = f" {body} "
        norm = BM25_K1 * (1 - BM25_B + BM25_B * len(body) / average)
        score = 0.0
        for pattern in patterns:
            count = len(pattern.findall(padded))
            score += count * (BM25_K1 + 1) / (count + norm)
        scores.append(score)
    return scores
