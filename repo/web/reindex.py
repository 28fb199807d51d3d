"""The console's "Rebuild the index": run in a background thread, one at a time, its
progress read by the health page (a rebuild of a million messages outlasts what a
browser or a reverse proxy waits for one request)."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from sessionrepo.errors import RepoError
from sessionrepo.store.repository import SessionRepository

log = logging.getLogger("sessionrepo.web")


class ReindexProgress(BaseModel):
    """Where the last rebuild of the search index is."""

    model_config = ConfigDict(frozen=True)

    state: Literal["running", "done", "failed"]
    #: Messages indexed so far (when done: all of them).
    done: int
    #: Messages to index, once the rebuild has counted them.
    total: int | None
    started_at: datetime
    finished_at: datetime | None
    #: Why it failed (one line).
    error: str | None


class BackgroundReindex:
    """Runs ``repository.reindex`` in a thread of its own, one rebuild at a time.

    The thread is a daemon: stopping the console does not wait for a rebuild, which the
    index then reports as unfinished (rebuild it again).
    """

    def __init__(self, repository: SessionRepository) -> None:
        self._repository = repository
        self._lock = threading.Lock()
        self._progress: ReindexProgress | None = None
        self._thread: threading.Thread | None = None

    @property
    def progress(self) -> ReindexProgress | None:
        """The running or last rebuild (``None``: none since start)."""
        return self._progress

    def start(self) -> bool:
        """Start a rebuild; ``False`` (and nothing started) when one is running."""
        with self._lock:
            if self._progress is not None and self._progress.state == "running":
                return False
            self._progress = ReindexProgress(
                state="running",
                done=0,
                total=None,
                started_at=datetime.now(UTC),
                finished_at=None,
                error=None,
            )
            self._thread = threading.Thread(
                target=self._run, name="sessionrepo-console-reindex", daemon=True
            )
            self._thread.start()
        return True

    def wait(self, timeout: float | None = None) -> None:
        """Until the running rebuild (if any) ends, or ``timeout`` seconds."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _update(self, **changes: object) -> None:
        assert self._progress is not None
        # One assignment of a new frozen model: a reader sees the old or the new, whole.
        self._progress = self._progress.model_copy(update=changes)

    def _run(self) -> None:
        try:
            indexed = self._repository.reindex(
                progress=lambda done, total: self._update(done=done, total=total)
            )
        except RepoError as exc:
            self._update(
                state="failed", finished_at=datetime.now(UTC), error=" ".join(str(exc).split())
            )
        except Exception:
            log.exception("console: the search index rebuild failed")
            self._update(
                state="failed",
                finished_at=datetime.now(UTC),
                error="internal error (the server's log has the details)",
            )
        else:
            self._update(state="done", done=indexed, finished_at=datetime.now(UTC))


__all__ = ["BackgroundReindex", "ReindexProgress"]
