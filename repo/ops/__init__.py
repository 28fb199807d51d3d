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
"""

from __future__ import annotations

from sessionrepo.models.doctor import Check, CheckStatus
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
    "DOCTOR_CHECKS",
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "MAX_BATCH",
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
    "missing_sqlite_file",
    "parse_duration",
    "prune_sessions",
    "run_doctor",
]
