"""User queries: words, "quoted phrases", ``prefix*`` and ``-excluded``, parsed once.

Anything else a user types is literal text: operators such as ``AND``, ``NEAR(`` or
``col:x`` are just words, and nothing reaches SQL except as a bound parameter. The
dialects compile a :class:`Query` into their own SQL (FTS5 ``MATCH``, ``tsquery``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from sessionrepo.search.text import words

#: Longest query accepted, in characters.
MAX_QUERY_CHARS: Final = 10_000
#: Most terms a query may have (the rest are ignored).
MAX_TERMS: Final = 32


@dataclass(frozen=True)
class Term:
    """One query term: a word or phrase (``words``), matched as a prefix or excluded."""

    words: tuple[str, ...]
    prefix: bool = False
    excluded: bool = False


@dataclass(frozen=True)
class Query:
    """A parsed query: every positive term must occur, no excluded one may."""

    terms: tuple[Term, ...] = field(default_factory=tuple)

    @property
    def positive(self) -> tuple[Term, ...]:
        return tuple(term for term in self.terms if not term.excluded)

    @property
    def negative(self) -> tuple[Term, ...]:
        return tuple(term for term in self.terms if term.excluded)


@dataclass(frozen=True)
class SearchFilters:
    """What narrows a search besides its terms (``None``: not narrowed by it)."""

    session_id: str | None = None
    source: str | None = None
    role: str | None = None
    user_id: str | None = None
    #: Messages at or after this time.
    since: datetime | None = None
    #: Messages before this time.
    until: datetime | None = None


_TOKEN = re.compile(r'(-?)"([^"]*)"?|(-?)(\S+)')


def parse_query(text: str) -> Query:
    """Words, "phrases", ``prefix*`` and ``-excluded``; everything else is literal text
    (operators such as ``AND``, ``NEAR(`` or ``col:x`` are just words)."""
    if len(text) > MAX_QUERY_CHARS:
        text = text[:MAX_QUERY_CHARS]
    terms: list[Term] = []
    for match in _TOKEN.finditer(text):
        quoted_minus, phrase, minus, bare = match.groups()
        if phrase is not None:
            found = tuple(words(phrase))
            if found:
                terms.append(Term(found, excluded=bool(quoted_minus)))
            continue
        excluded = bool(minus) and len(bare) > 1
        prefix = bare.endswith("*")
        found = tuple(words(bare))
        if not found:
            continue
        # "a_b", "x-y" or a CJK run: the words must come together, as a phrase.
        terms.append(Term(found, prefix=prefix and len(found) == 1, excluded=excluded))
    return Query(tuple(terms[:MAX_TERMS]))
