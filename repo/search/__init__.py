"""Backend-free search: pure functions over strings, the same for every backend.

- :mod:`.text`: what is indexed (content parts to text, case and diacritics folded, CJK
  and symbols as words of their own), so both backends' tokenizers see the same words;
- :mod:`.query`: user queries parsed into :class:`~.query.Query` terms and the filters;
- :mod:`.ranking`: BM25 over indexed documents, for a backend that ranks in Python;
- :mod:`.snippets`: the extract shown for a hit, which also proves the hit matches.

It sits below :mod:`sessionrepo.dialects`, which compile a parsed query into their own
SQL, and :mod:`sessionrepo.store.search_index`, which keeps the index beside the
transcript; it imports nothing of theirs.
"""

from sessionrepo.search.query import Query, Term, parse_query

__all__ = ["Query", "Term", "parse_query"]
