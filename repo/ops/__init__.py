"""Operator tools: export, import (restore) and prune sessions; ``doctor``.

What an operator runs against a store, as a library (the CLI's ``export``, ``import``,
``prune`` and ``doctor`` commands are thin shells over it), one module each:

- :mod:`~sessionrepo.ops.export`: the export format (JSON Lines) and its writer;
- :mod:`~sessionrepo.ops.restore`: importing an export, restoring or merging sessions;
- :mod:`~sessionrepo.ops.prune`: deleting ended sessions older than a cutoff;
- :mod:`~sessionrepo.ops.backup`: consistent backups of the whole store, verified restores;
- :mod:`~sessionrepo.ops.doctor`: the health checks.

Export, import and prune work on :class:`~sessionrepo.store.repository.SessionRepository`'s
public methods only: no SQL of their own, no reaching past the repository (restore writes
through the same insert as ``append``). The doctor is the exception, by necessity: it
inspects a database that may not be a working repository (see its module).
"""

from __future__ import annotations

from sessionrepo.models.doctor import Check, CheckStatus
from sessionrepo.ops.backup import (
    BACKUP_FORMAT,
    BACKUP_VERSION,
    BackupReport,
    BadBackupFile,
    RestoreBackupReport,
    backup_store,
    restore_backup,
    verify_backup_file,
)
from sessionrepo.ops.doctor import (
    DOCTOR_CHECKS,
    DoctorReport,
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
    "BACKUP_FORMAT",
    "BACKUP_VERSION",
    "DOCTOR_CHECKS",
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "MAX_BATCH",
    "BackupReport",
    "BadBackupFile",
    "BadExportFile",
    "Check",
    "CheckStatus",
    "DoctorReport",
    "ExportReport",
    "ImportReport",
    "PruneReport",
    "RestoreBackupReport",
    "Selection",
    "backup_store",
    "count_prunable",
    "count_sessions",
    "export_sessions",
    "import_sessions",
    "missing_sqlite_file",
    "parse_duration",
    "prune_sessions",
    "restore_backup",
    "run_doctor",
    "verify_backup_file",
]
