"""What ``sessionrepo doctor`` reads of a PostgreSQL server (its settings) and judges."""

from __future__ import annotations

from typing import Final

from sqlalchemy import Connection, text

from sessionrepo.dialects.base import ProbeRole
from sessionrepo.dialects.postgresql.tenancy import role_rights, tenant_count
from sessionrepo.models.doctor import Check

#: Oldest PostgreSQL major version sessionrepo is tested on.
MIN_POSTGRES: Final = 13


class PostgresProbes(ProbeRole):
    """The server's version and the settings durability depends on."""

    def server_version(self, connection: Connection) -> str:
        return str(connection.exec_driver_sql("SHOW server_version").scalar()).split()[0]

    def settings(self, connection: Connection) -> dict[str, str]:
        settings = {
            name: str(connection.exec_driver_sql(f"SHOW {name}").scalar())
            for name in (
                "server_version_num",
                "synchronous_commit",
                "fsync",
                "full_page_writes",
                "TimeZone",
                "default_transaction_read_only",
            )
        }
        settings["in_recovery"] = str(
            connection.execute(text("SELECT pg_is_in_recovery()")).scalar()
        )
        rights = role_rights(connection)
        settings["role"] = rights.role
        settings["role_bypass"] = rights.describe() if rights.bypasses else ""
        settings["tenants"] = str(tenant_count(connection))
        return settings

    def judge_settings(self, settings: dict[str, str]) -> list[Check]:
        """Judge PostgreSQL settings as a sessionrepo session sees them."""
        checks = []
        major = int(settings["server_version_num"]) // 10_000
        checks.append(
            Check(name="server_version", status="ok", detail=str(major))
            if major >= MIN_POSTGRES
            else Check(
                name="server_version",
                status="warn",
                detail=f"{major}: older than {MIN_POSTGRES}, untested",
                fix=f"upgrade PostgreSQL to {MIN_POSTGRES} or later",
            )
        )
        commit = settings["synchronous_commit"]
        checks.append(
            Check(name="synchronous_commit", status="ok", detail=commit)
            if commit != "off"
            else Check(
                name="synchronous_commit",
                status="fail",
                detail="off: a server crash loses commits already acknowledged to gateways",
                fix="set synchronous_commit = on (ALTER SYSTEM, or reset it for the "
                "database / role the gateways use)",
            )
        )
        checks.append(
            Check(name="fsync", status="ok", detail="on")
            if settings["fsync"] == "on"
            else Check(
                name="fsync",
                status="fail",
                detail="off: a crash can lose or corrupt committed data",
                fix="set fsync = on in postgresql.conf",
            )
        )
        checks.append(
            Check(name="full_page_writes", status="ok", detail="on")
            if settings["full_page_writes"] == "on"
            else Check(
                name="full_page_writes",
                status="warn",
                detail="off: a crash during a page write can corrupt it",
                fix="set full_page_writes = on unless the file system rules torn pages out",
            )
        )
        zone = settings["TimeZone"]
        checks.append(
            Check(name="timezone", status="ok", detail=zone)
            if zone.upper() in ("UTC", "ETC/UTC")
            else Check(
                name="timezone",
                status="warn",
                detail=f"{zone}: sessionrepo asks for UTC at connect (a pooler may drop that)",
                fix="let connection options through the pooler, or set the role's timezone to UTC",
            )
        )
        read_only = (
            settings["in_recovery"] == "True" or settings["default_transaction_read_only"] == "on"
        )
        checks.append(
            Check(name="writable", status="ok", detail="read-write")
            if not read_only
            else Check(
                name="writable",
                status="fail",
                detail="read-only (a standby, or default_transaction_read_only = on)",
                fix="point --url at the primary server",
            )
        )
        checks.append(_judge_tenancy(settings))
        return checks


def _judge_tenancy(settings: dict[str, str]) -> Check:
    """Whether the connecting role is held to the tenants' policies: a failure once the
    store has tenant roles (it could read and change all of theirs); before, a role the
    policies do not hold is one gateway's store as it always was."""
    bypass, tenants = settings["role_bypass"], int(settings["tenants"])
    if not bypass:
        return Check(
            name="tenancy",
            status="ok",
            detail=f"role {settings['role']!r} is held to the row-level security policies",
        )
    if tenants:
        return Check(
            name="tenancy",
            status="fail",
            detail=f"{bypass}: it reads and changes every tenant's conversations "
            f"({tenants} tenant roles), the policies do not hold it",
            fix="connect each gateway as its own tenant role (`sessionrepo tenants create "
            "NAME`); keep this role for migrations and the operator",
        )
    # No tenant roles: the store is one gateway's, there is no one else's data to reach
    # (the check fails as soon as `sessionrepo tenants create` makes the first).
    return Check(
        name="tenancy",
        status="ok",
        detail=f"{bypass}, and the store has no tenant roles: one gateway's store",
    )
