"""Citus (distributed PostgreSQL): the schema distributed by session id, and the few
statements that must differ so that Citus can route them.

A database is a Citus coordinator when it has the ``citus`` extension; the store finds
out on its first connection (:func:`~.distribution.is_coordinator`) and then uses
:class:`CitusDialect`, a :class:`~sessionrepo.dialects.postgresql.PostgresDialect` that
differs only where Citus needs it.

The distribution (:func:`~.distribution.distribute_schema`, run by migration 0006 and by any later
migration that adds a table):

- ``sessions`` is hash-distributed by ``id``;
- every other table with a ``session_id`` column (``messages``, ``search_backlog``,
  ``message_search``, ``pending_outbox``, and whatever later revisions add) by
  ``session_id``, co-located with ``sessions``: a session's rows of every table live in
  one shard group, on one worker, and a statement filtered by one session id is routed
  there whole;
- every other table (``search_index_state``) is a reference table, copied to every
  worker; ``alembic_version`` stays a plain table on the coordinator, which alone
  migrates.

What differs once distributed: Citus refuses ``FOR UPDATE`` on a statement that spans
shards (SQLSTATE 0A000), so the search catch-up claims backlog rows one session at a
time (:meth:`.search.CitusSearch.take_search_backlog`); the outbox's claims are per session
already. Everything else (listing, search across sessions, prune, export) is the
PostgreSQL SQL as it is: a multi-shard read with ``ORDER BY ... LIMIT`` is fine on Citus.

One module per role of the dialect, as for PostgreSQL (:mod:`.engine`, :mod:`.append`,
:mod:`.search`, :mod:`.probes`, joined in :mod:`.dialect`), and :mod:`.distribution`.
"""

from sessionrepo.dialects.citus.dialect import CitusDialect
from sessionrepo.dialects.citus.distribution import (
    distribute_schema,
    has_citus,
    is_coordinator,
    undistribute_schema,
)

__all__ = [
    "CitusDialect",
    "distribute_schema",
    "has_citus",
    "is_coordinator",
    "undistribute_schema",
]
