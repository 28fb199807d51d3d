"""Whose conversations a console page shows: its store connection's tenant, or, for the
operator's console, the tenant the page names (``tenant=``).

A console whose connection is one tenant's (a tenant's role, ``SESSIONREPO_TENANT``, a
SQLite file) shows that tenant and offers no choice. A console whose connection sees
several tenants (on PostgreSQL a role the policies do not hold, in a store with rows in
``tenants``: the operator's) reads each tenant's pages through a repository opened for
that tenant (``open_repository(url, tenant=NAME)``), so the server's policies hold every
read and write of the page to it: nothing here filters by tenant in SQL. Those
repositories are opened on first use, kept, and closed with the console.

Without a tenant named, the operator's pages that show conversations answer with the
tenants and their session counts, to pick one (see :class:`Scope`): ids are per tenant
(two tenants may both hold ``discord:42``), so a page mixing them could not say which
session a link opens.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sqlalchemy import Connection

from sessionrepo.dialects import TENANT_NAME
from sessionrepo.dialects.postgresql.tenancy import role_rights, tenant_count
from sessionrepo.errors import NotFound, RepoError
from sessionrepo.observability.tenants import tenant_of
from sessionrepo.ops.tenants import TenantInfo, list_tenants
from sessionrepo.search.embedders import Embedder, default_embedder
from sessionrepo.store.repository import SessionRepository, open_repository


@dataclass(frozen=True)
class Scope:
    """What one request reads: a tenant's repository, or (the operator's console, no
    ``tenant=``) none yet."""

    #: ``None``: the operator's console and no tenant chosen (the page offers them).
    repository: SessionRepository | None
    #: The tenant chosen with ``tenant=`` (kept in the page's links and forms); ``None``
    #: on a console of one tenant, or before a choice.
    tenant: str | None
    #: The tenants to pick from (the operator's console), else ``None``: no picker.
    choices: tuple[str, ...] | None


class Tenants:
    """The console's tenants: whether it is the operator's, and one repository per tenant
    it has shown."""

    def __init__(self, repository: SessionRepository, embedder: Embedder | bool | None) -> None:
        self.base = repository
        self._embedder = embedder
        self._operator: bool | None = None
        self._opened: dict[str, SessionRepository] = {}
        self._lock = threading.Lock()
        self._closed = False

    def operator(self) -> bool:
        """Whether the connection sees several tenants; asked of the server once (until
        it answers: a console started while the primary is down asks again)."""
        if self._operator is None:
            database = self.base.database
            if database.tenant is not None or not database.dialect.capabilities.tenant_roles:
                self._operator = False
            else:

                def sees_several(conn: Connection) -> bool:
                    return role_rights(conn).bypasses and tenant_count(conn) > 0

                self._operator = database.read(sees_several)
        return self._operator

    def names(self) -> tuple[str, ...]:
        """The store's tenants, in name order (the operator's console)."""
        return tuple(
            self.base.database.read(
                lambda conn: conn.exec_driver_sql(
                    "SELECT tenant FROM tenants ORDER BY tenant"
                ).scalars()
            )
        )

    def listed(self) -> list[TenantInfo]:
        """The tenants with their session counts (``sessionrepo tenants list``)."""
        return list_tenants(self.base.database.url)

    def scope(self, tenant: str | None) -> Scope:
        """The repository a request with ``tenant=`` (or none) reads.

        Raises:
            NotFound: ``tenant`` is no tenant of this store, or (a console of one
                tenant) another tenant than its own.
        """
        if not self.operator():
            if tenant is not None and tenant != tenant_of(self.base.database):
                raise NotFound("this console shows one tenant's conversations, not another's")
            return Scope(self.base, None, None)
        choices = self.names()
        if tenant is None:
            return Scope(None, None, choices)
        if not TENANT_NAME.match(tenant) or tenant not in choices:
            raise NotFound("no tenant of that name in this store")
        return Scope(self._repository(tenant), tenant, choices)

    def _repository(self, tenant: str) -> SessionRepository:
        opened = self._opened.get(tenant)
        if opened is not None:
            return opened
        with self._lock:
            opened = self._opened.get(tenant)
            if opened is None:
                if self._closed:
                    raise RepoError("the console is closing")
                if self._embedder is None:
                    # One for every tenant shown: one model in memory, not one per tenant.
                    self._embedder = default_embedder() or False
                opened = self._opened[tenant] = open_repository(
                    self.base.database.url,
                    read_only=self.base.database.read_only,
                    embedder=self._embedder,
                    tenant=tenant,
                )
        return opened

    def close(self) -> None:
        """Close the tenants' repositories (the console's own is its caller's)."""
        with self._lock:
            self._closed = True
            opened, self._opened = list(self._opened.values()), {}
        for repository in opened:
            repository.close()
