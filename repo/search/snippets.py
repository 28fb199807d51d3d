"""Snippets: a short extract of a hit's text around its first match, matches marked.

Making one also checks the hit: a text that does not satisfy the query gets no snippet,
which tells the caller that the index named a message it should not have.
"""

from __future__ import annotations

import re
from typing import Any, Final

from sessionrepo.search.query import Query, Term
from sessionrepo.search.text import CJK, document, words

#: Characters of a snippet (before the brackets and ellipses are added).
SNIPPET_CHARS: Final = 160


#: A snippet as runs of text, each marked as a match of the query or not.
SnippetParts = list[tuple[str, bool]]


def make_snippet(text: str, parsed: Query) -> str | None:
    """A short extract around the first match, matches in [brackets]; ``None`` when the
    text does not satisfy the query (so the index was wrong). Brackets the text itself
    holds are not escaped: :func:`snippet_parts` tells them apart."""
    parts = snippet_parts(text, parsed)
    return None if parts is None else bracketed(parts)


def bracketed(parts: SnippetParts) -> str:
    """The runs as one string, the matches in [brackets]."""
    return "".join(f"[{run}]" if hit else run for run, hit in parts)


def snippet_parts(text: str, parsed: Query) -> SnippetParts | None:
    """The extract of :func:`make_snippet` as ``(text, is_match)`` runs (whitespace
    collapsed, adjacent matches joined, ``…`` where text was left out); ``None`` when the
    text does not satisfy the query."""
    indexed = " " + document(text) + " "
    positive = parsed.positive
    if not all(_occurs(term, indexed) for term in positive):
        return None
    if any(_occurs(term, indexed) for term in parsed.negative):
        return None
    # Walk the source words only as far as the extract needs, from where the first
    # match may begin (again from the start if the guess was wrong: see below).
    begin = end = -1
    marked: list[tuple[int, int]] = []
    hint = _first_possible_match(text, parsed)
    for start in (hint, 0) if hint else (0,):
        flat: list[tuple[str, int, int]] = []  # (index word, source start, source end)
        for match in _SOURCE_WORD.finditer(text, start):
            if end >= 0 and match.start() >= end:
                break
            for part in words(match.group()):
                flat.append((part, match.start(), match.end()))
                for term in positive:
                    size = len(term.words)
                    if len(flat) >= size and _matches(term, [w for w, _, _ in flat[-size:]]):
                        marked.append((flat[-size][1], flat[-1][2]))
                        if begin < 0:
                            begin = max(0, flat[-size][1] - SNIPPET_CHARS // 3)
                            end = min(len(text), begin + SNIPPET_CHARS)
        if begin >= 0:
            break
    if begin < 0:  # matched words the source splits differently: show the start
        begin, end = 0, min(len(text), SNIPPET_CHARS)
    runs: SnippetParts = [("…", False)] if begin else []
    cursor = begin
    for start, stop in sorted(marked):
        if start < cursor or stop > end:
            continue
        runs += [(text[cursor:start], False), (text[start:stop], True)]
        cursor = stop
    runs.append((text[cursor:end], False))
    if end < len(text):
        runs.append(("…", False))
    return _tidy(runs)


def _tidy(runs: SnippetParts) -> SnippetParts:
    """``runs`` with whitespace collapsed across them as ``" ".join(text.split())`` does to
    one string, empty runs dropped and neighbours of the same kind joined ("3.14" matched
    as 3, . and 14 reads as one match)."""
    tidy: list[list[Any]] = []
    space = False  # whitespace seen since the last text kept

    def add(piece: str, hit: bool) -> None:
        if tidy and tidy[-1][1] == hit:
            tidy[-1][0] += piece
        else:
            tidy.append([piece, hit])

    for run, hit in runs:
        chunks = run.split()
        if not chunks:
            space = space or bool(run)
            continue
        if tidy and (space or run[0].isspace()):
            add(" ", False)
        add(" ".join(chunks), hit)
        space = run[-1].isspace()
    return [(piece, hit) for piece, hit in tidy]


#: Source words: runs of letters and digits, and every CJK character or symbol.
_SOURCE_WORD = re.compile(rf"[{CJK}]|[^\w\s]|[^\W_]+")


def _first_possible_match(text: str, parsed: Query) -> int:
    """Where the first word of a positive term first occurs in the source text as it
    is (0 when it does not), so that a long text is not walked word by word up to
    there. In ASCII text no match can begin before it; in other text the index word may
    come from other source letters (fullwidth "cafe" is "cafe"), so a walk from there that
    finds nothing is done again from the start."""
    first = len(text)
    for term in parsed.positive:
        word = re.escape(term.words[0])
        tail = "" if term.prefix else "(?![A-Za-z0-9])"
        found = re.search(f"(?<![A-Za-z0-9]){word}{tail}", text, re.IGNORECASE)
        if found is not None:
            first = min(first, found.start())
    return 0 if first == len(text) else first


def _matches(term: Term, window: list[str]) -> bool:
    if window[:-1] != list(term.words[:-1]):
        return False
    last, wanted = window[-1], term.words[-1]
    return last == wanted or (term.prefix and last.startswith(wanted))


def _occurs(term: Term, words: str) -> bool:
    """Whether ``term`` occurs in a document's index words (space-separated, with a
    space before the first and after the last)."""
    if len(term.words) == 1:
        needle = " " + term.words[0]
        return needle in words if term.prefix else needle + " " in words
    return re.search(" " + " +".join(map(re.escape, term.words)) + " ", words) is not None
