"""The store: what a gateway's append and load run on.

- :mod:`.repository`: :class:`SessionRepository`, the implementation of
  :class:`sessionrepo.contract.SessionStore`;
- :mod:`.codec`: Pydantic messages to stored rows and back;
- :mod:`.database`: engines, transactions, lock-race retries, error translation;
- :mod:`.schema`: Alembic on open (the head check, upgrades);
- :mod:`.search_index`: keeping the search index beside the transcript;
- :mod:`.bridge`: the greenlet bridge that lets this synchronous code run on asyncio drivers.

It sits above :mod:`sessionrepo.dialects` (the SQL that differs per backend) and
:mod:`sessionrepo.search` (backend-free text handling), and below the outbox, the async API
and every entry point.
"""
