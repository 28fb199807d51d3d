"""Operator tools: export, import (restore) and prune sessions; ``doctor``.

What an operator runs against a store, as a library (the CLI's ``export``, ``import``,
``prune`` and ``doctor`` commands are thin shells over it), one module each:

- :mod:`~sessionrepo.ops.export`: the export format (JSON Lines) and its writer;
- :mod:`~sessionrepo.ops.restore`: importing an export, restoring or merging sessions;
- :mod:`~sessionrepo.ops.prune`: deleting ended sessions older than a cutoff;
- :mod:`~sessionrepo.ops.doctor`: the health checks.

Export, import and prune work on :class:`~sessionrepo.store.repository.SessionRepository`'s
public methods only: no SQL of their own, no reaching past the repository (restore writes
through the same insert as ``append``). The doctor is the exception, by necessity: it
inspects a database that may not be a working repository (see its module).

The backend-settings probes and judgements below belong with the dialects, which take
them next; :mod:`~sessionrepo.ops.doctor` calls them from here until then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from sqlalchemy import Connection, text

from sessionrepo.ops.doctor import (
    DOCTOR_CHECKS,
    Check,
    CheckStatus,
    DoctorReport,
    _Probe,
    missing_sqlite_file,
    run_doctor,
)
from sessionrepo.ops.export import (
    EXPORT_FORMAT,
    EXPORT_VERSION,
    BadExportFile,
    ExportReport,
    Selection,
    count_sessions,
    export_sessions,
)
from sessionrepo.ops.prune import (
    PruneReport,
    count_prunable,
    parse_duration,
    prune_sessions,
)
from sessionrepo.ops.restore import MAX_BATCH, ImportReport, import_sessions

__all__ = [
    "DOCTOR_CHECKS",
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "MAX_BATCH",
    "MIN_POSTGRES",
    "BadExportFile",
    "Check",
    "CheckStatus",
    "DoctorReport",
    "ExportReport",
    "ImportReport",
    "PruneReport",
    "Selection",
    "count_prunable",
    "count_sessions",
    "export_sessions",
    "import_sessions",
    "judge_postgres",
    "judge_sqlite",
    "missing_sqlite_file",
    "parse_duration",
    "prune_sessions",
    "run_doctor",
]


# Backend settings. Dialect-specific SQL belongs in repo/_dialects.py; these read-only
# probes live here until that module (being changed for issue 4) can take them.


@dataclass(frozen=True)
class _SettingsProbe:
    version: Callable[[Connection], str]
    settings: Callable[[Connection], dict[str, str]]
    judge: Callable[[dict[str, str]], list[Check]]


def _sqlite_settings(conn: Connection) -> dict[str, str]:
    return {
        name: str(conn.exec_driver_sql(f"PRAGMA {name}").scalar())
        for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
    }


def judge_sqlite(settings: dict[str, str]) -> list[Check]:
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


def _postgres_settings(conn: Connection) -> dict[str, str]:
    settings = {
        name: str(conn.exec_driver_sql(f"SHOW {name}").scalar())
        for name in (
            "server_version_num",
            "synchronous_commit",
            "fsync",
            "full_page_writes",
            "TimeZone",
            "default_transaction_read_only",
        )
    }
    settings["in_recovery"] = str(conn.execute(text("SELECT pg_is_in_recovery()")).scalar())
    return settings


#: Oldest PostgreSQL major version sessionrepo is tested on.
MIN_POSTGRES: Final = 13


def judge_postgres(settings: dict[str, str]) -> list[Check]:
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
    return checks


def _sqlite_version(conn: Connection) -> str:
    return str(conn.exec_driver_sql("SELECT sqlite_version()").scalar())


def _postgres_version(conn: Connection) -> str:
    return str(conn.exec_driver_sql("SHOW server_version").scalar()).split()[0]


_SETTINGS: Final = {
    "sqlite": _SettingsProbe(_sqlite_version, _sqlite_settings, judge_sqlite),
    "postgresql": _SettingsProbe(_postgres_version, _postgres_settings, judge_postgres),
}


def _check_settings(probe: _Probe) -> Iterator[Check]:
    assert probe.database is not None
    backend = _SETTINGS[probe.database.backend]
    settings = probe.database.read(backend.settings)
    prefix = probe.database.backend
    for check in backend.judge(settings):
        yield check.model_copy(update={"name": f"{prefix}.{check.name}"})
