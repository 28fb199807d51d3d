"""The PostgreSQL dialect: its roles joined, and what it can do."""

from __future__ import annotations

from sessionrepo.dialects.base import BackendDialect, Capabilities
from sessionrepo.dialects.postgresql.append import PostgresAppend
from sessionrepo.dialects.postgresql.engine import PostgresEngine
from sessionrepo.dialects.postgresql.erasure import PostgresErasure
from sessionrepo.dialects.postgresql.probes import PostgresProbes
from sessionrepo.dialects.postgresql.search import PostgresSearch
from sessionrepo.dialects.postgresql.vectors import PostgresVectors


class PostgresDialect(
    PostgresEngine,
    PostgresAppend,
    PostgresSearch,
    PostgresVectors,
    PostgresProbes,
    PostgresErasure,
    BackendDialect,
):
    """PostgreSQL through psycopg 3 (its async mode for asyncio)."""

    name = "postgresql"
    display_name = "PostgreSQL"
    capabilities = Capabilities(
        migrates_on_open=False,
        connect_may_hang=True,
        retry_waits_out_bound=False,
        screens_erasure=True,
        tenant_roles=True,
    )
