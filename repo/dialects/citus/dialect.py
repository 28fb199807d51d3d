"""The Citus dialect: PostgreSQL's, with the roles Citus needs changed."""

from __future__ import annotations

import dataclasses

from sessionrepo.dialects.citus.append import CitusAppend
from sessionrepo.dialects.citus.engine import CitusEngine
from sessionrepo.dialects.citus.probes import CitusProbes
from sessionrepo.dialects.citus.search import CitusSearch
from sessionrepo.dialects.postgresql import PostgresDialect


class CitusDialect(CitusEngine, CitusAppend, CitusSearch, CitusProbes, PostgresDialect):
    """PostgreSQL on a Citus coordinator, the schema distributed by session id.

    Its capabilities are PostgreSQL's (the delegated append screens erasures under the
    session's lock too: migration 0016), but a correlated subquery cannot read a subquery
    in ``FROM``."""

    capabilities = dataclasses.replace(
        PostgresDialect.capabilities, correlates_into_subqueries=False
    )

    @classmethod
    def like(cls, dialect: PostgresDialect) -> CitusDialect:
        """A Citus dialect with ``dialect``'s settings (its search configuration)."""
        citus = cls()
        citus.__dict__.update(dialect.__dict__)
        return citus
