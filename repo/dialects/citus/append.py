"""The append on Citus: the locked path only (each statement routed to one shard)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sessionrepo.dialects.base import DirectAppend, DirectLoad, DirectResult
from sessionrepo.dialects.postgresql.append import PostgresAppend


class CitusAppend(PostgresAppend):
    """No driver-level statements: each one of the locked path is routed by Citus."""

    def append_direct(self, driver: Any, append: DirectAppend) -> DirectResult | None:
        # Citus plans a data-modifying CTE as a chain of subplans, the batch pulled
        # through the coordinator: the one-statement append would not be one round
        # trip here, and its FOR UPDATE inside a CTE is not routable. The locked path
        # (a routed lock, a routed insert) is what the router test checks.
        return None

    def load_direct(self, driver: Any, load: DirectLoad) -> list[Sequence[Any]] | None:
        # Through SQLAlchemy, as every other statement here: the router test sees them
        # all (its statement log listens to SQLAlchemy's cursor events).
        return None
