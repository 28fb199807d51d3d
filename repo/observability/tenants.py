"""The ``tenant`` label of every metric: whose conversations a count or a gauge is about.

A repository's tenant (README, "Several gateways, one store") is resolved once per
database and kept while the database lives, so a call pays a dictionary lookup, never a
round trip:

- opened for one (``open_repository(url, tenant=NAME)``, ``SESSIONREPO_TENANT``): that
  tenant (the store checked it when it opened);
- PostgreSQL otherwise: the role it connects as, read from its URL (the user it names,
  else libpq's default: ``PGUSER``, then the operating system's user), or the ``role``
  its ``options`` set;
- a SQLite file otherwise: the tenant that claimed it, ``default`` while none did (one
  read, the first time a metric of it is recorded).

So the label takes one value per tenant a process serves (a gateway: its own), whatever
its sessions, users or traffic. When the tenant cannot be read (a SQLite file that cannot
be opened now) the label is ``unknown``, and it is read again next time.

This package sits below the store (``sessionrepo.store`` imports it), so it reads what it
needs through the database's public attributes and the ``tenants`` table only.
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.engine import URL

from sessionrepo.errors import RepoError
from sessionrepo.models.tables import tenants_table

#: A SQLite file no tenant claimed (``sessionrepo.store.tenancy.DEFAULT_TENANT``, which
#: this layer may not import).
DEFAULT_TENANT: Final = "default"
#: The label of a database whose tenant could not be read.
UNKNOWN: Final = "unknown"

_ROLE_OPTION: Final = re.compile(r"(?:^|\s)-c\s*role=([A-Za-z_][A-Za-z0-9_$]*)")
_resolved: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def tenant_of(database: Any) -> str:
    """The ``tenant`` label of what runs on ``database`` (a
    :class:`~sessionrepo.store.database.Database`; ``None``: ``unknown``)."""
    if database is None:
        return UNKNOWN
    try:
        return _resolved[database]
    except KeyError:
        pass
    tenant = _resolve(database)
    if tenant is None:
        return UNKNOWN
    with _lock:
        _resolved[database] = tenant
    return tenant


def _resolve(database: Any) -> str | None:
    if database.tenant is not None:
        return str(database.tenant)
    if database.dialect.capabilities.tenant_roles:
        return login_role(database.url)
    try:
        claimed = database.read(
            lambda conn: conn.execute(select(tenants_table.c.tenant).limit(1)).scalar()
        )
    except RepoError:
        return None
    return DEFAULT_TENANT if claimed is None else str(claimed)


def login_role(url: URL) -> str:
    """The role a PostgreSQL URL connects as, without connecting: the ``role`` its
    ``options`` set, else the user it names, else libpq's default user."""
    options = url.query.get("options")
    for value in (options,) if isinstance(options, str) else options or ():
        found = _ROLE_OPTION.search(value)
        if found:
            return found.group(1)
    user = url.username or url.query.get("user")
    if isinstance(user, str) and user:
        return user
    import psycopg.pq

    defaults = {option.keyword: option.val for option in psycopg.pq.Conninfo.get_defaults()}
    default = defaults.get(b"user")
    return default.decode() if default else UNKNOWN
