"""Backend-free search: text preparation, query parsing, ranking and snippets.

Pure functions over strings: the dialects compile a parsed query into their own SQL, and
:mod:`sessionrepo.store.search_index` keeps the index beside the transcript.
"""
