"""Opening a store whose schema is current logs nothing from Alembic (it used to log nine
INFO lines: its plugins as it was imported, and each revision check's "Context impl");
a migration that runs is still logged as Alembic logs it."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading

import pytest

from sessionrepo import open_async_repository, open_repository
from sessionrepo.store import schema


def _alembic(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("alembic")]


def test_importing_and_opening_a_current_store_logs_nothing(database_url: str) -> None:
    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)\n"
        "from sessionrepo import open_repository\n"
        "open_repository(sys.argv[1]).close()\n"
        "open_repository(sys.argv[1], read_only=True).close()\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, database_url], capture_output=True, text=True, check=True
    )
    assert "alembic" not in run.stderr


def test_opening_a_current_store_logs_nothing_sync_and_async(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with open_repository(database_url) as repo:
        repo.list_sessions()

    async def asynchronously() -> None:
        repo = await open_async_repository(database_url)
        try:
            await repo.list_sessions()  # the schema is checked on first use
        finally:
            await repo.close()

    asyncio.run(asynchronously())
    assert _alembic(caplog) == []


def test_a_migration_that_runs_is_logged(
    empty_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    open_repository(empty_database_url, auto_migrate=True).close()
    assert any(line.startswith("Running upgrade  -> 0001") for line in _alembic(caplog))


def test_what_other_threads_log_through_alembic_still_gets_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    with schema._quiet_alembic():
        other = threading.Thread(
            target=logging.getLogger("alembic.runtime.migration").info, args=("from elsewhere",)
        )
        other.start()
        other.join()
        logging.getLogger("alembic.runtime.migration").info("from here")
        logging.getLogger("alembic.runtime.migration").warning("a warning from here")
    assert _alembic(caplog) == ["from elsewhere", "a warning from here"]
