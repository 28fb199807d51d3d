"""What ``sessionrepo doctor`` reads of a SQLite connection (its PRAGMAs) and judges."""

from __future__ import annotations

from sqlalchemy import Connection

from sessionrepo.dialects.base import ProbeRole
from sessionrepo.models.doctor import Check


class SQLiteProbes(ProbeRole):
    """The SQLite version and the PRAGMAs durability depends on."""

    def server_version(self, connection: Connection) -> str:
        return str(connection.exec_driver_sql("SELECT sqlite_version()").scalar())

    def settings(self, connection: Connection) -> dict[str, str]:
        return {
            name: str(connection.exec_driver_sql(f"PRAGMA {name}").scalar())
            for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
        }

    def judge_settings(self, settings: dict[str, str]) -> list[Check]:
        """Judge SQLite PRAGMAs as a sessionrepo connection sees them."""
        checks = []
        mode = settings["journal_mode"].lower()
        checks.append(
            Check(name="journal_mode", status="ok", detail="wal")
            if mode == "wal"
            else Check(
                name="journal_mode",
                status="fail",
                detail=f"{mode}: WAL could not be enabled, so writers block readers",
                fix="keep the file on a local file system (WAL needs shared memory), "
                "writable by every gateway",
            )
        )
        levels = {"0": "OFF", "1": "NORMAL", "2": "FULL", "3": "EXTRA"}
        level = levels.get(settings["synchronous"], settings["synchronous"])
        if level in ("FULL", "EXTRA"):
            checks.append(Check(name="synchronous", status="ok", detail=level))
        else:
            checks.append(
                Check(
                    name="synchronous",
                    status="fail" if level == "OFF" else "warn",
                    detail=f"{level}: a power loss may lose commits already acknowledged",
                    fix="leave sqlite_synchronous at its default (FULL)",
                )
            )
        checks.append(
            Check(name="foreign_keys", status="ok", detail="on")
            if settings["foreign_keys"] == "1"
            else Check(
                name="foreign_keys",
                status="fail",
                detail="off: deleting a session would leave its messages behind",
                fix="open the store with sessionrepo (its connections turn foreign keys on)",
            )
        )
        timeout = int(settings["busy_timeout"])
        checks.append(
            Check(name="busy_timeout", status="ok", detail=f"{timeout} ms")
            if timeout > 0
            else Check(
                name="busy_timeout",
                status="fail",
                detail="0 ms: a writer fails at once while another holds the lock",
                fix="leave busy_timeout at its default (10 s)",
            )
        )
        return checks
