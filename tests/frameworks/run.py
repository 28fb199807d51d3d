"""The frameworks' own session tests, run against sessionrepo's adapters (``make
test-frameworks``).

For each framework, the test files of the *installed* release (the version the extra
pins), with only the backend swapped by a plugin of ours (``shim_*.py``), on each backend:

- OpenAI Agents SDK and LangChain: their sdist from PyPI, downloaded at run time into a
  temporary folder (``pip download --no-binary :all: --no-deps NAME==VERSION``);
- Google ADK: its sdist has no tests, so they come from a checkout of google/adk-python
  at the installed release's tag, named by ``--adk-tests`` (or ``ADK_TESTS``); without it
  ADK is reported as not run, with that reason.

Their code is never copied into this repository. pytest-asyncio, which their async tests
need, is installed into the same temporary folder (not into the environment). Tests of
the frameworks' own backends' internals cannot apply to another backend: they are
deselected by name below, each with its reason, and listed in the report.

Usage: ``python tests/frameworks/run.py [--backend sqlite|postgres ...] [--framework
openai-agents|langchain|adk ...] [--adk-tests DIR] [--keep DIR]``; PostgreSQL from
``SESSIONREPO_TEST_POSTGRES_URL``. Prints each test's outcome per backend and a summary
line; exits 1 when a test that applies failed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

HERE = Path(__file__).resolve().parent

#: pytest-asyncio for their ``@pytest.mark.asyncio`` tests and async fixtures.
PYTEST_ASYNCIO = "pytest-asyncio>=1.2,<2"


@dataclass(frozen=True)
class Framework:
    name: str  #: the distribution (its installed version is the one tested)
    shim: str  #: our plugin that swaps the backend
    files: tuple[str, ...]  #: their session test files, relative to the source root
    #: Their tests that cannot apply to another backend, by node id: the reason each.
    deselected: dict[str, str] = field(default_factory=dict)
    #: pytest options of theirs that we keep.
    options: tuple[str, ...] = ()


_SQLITE_INTERNALS = "the SDK's SQLiteSession internals (its connections, locks, tables)"
_SQLITE_ERROR_TEXT = (
    "asserts SQLiteSession's own RuntimeError text; a closed SessionRepoSession raises "
    "RepoError ('this SessionRepoSession is closed')"
)
_CORRUPT_ROWS = (
    "writes undecodable JSON into the SDK's own agent_messages table; sessionrepo stores "
    "only validated messages, so there is no such row to skip"
)
_FAULT_INJECTION = "patches SQLiteSession's private transaction helpers to inject a fault"

_SQLALCHEMY = "tests/extensions/memory/test_sqlalchemy_session.py::"
_OWN_TABLES = (
    "reads or writes the SDK's own agent_messages rows through its private session factory"
)
_OWN_ENGINE = (
    "drives SQLAlchemySession's own engine, table-creation locks or engine registry "
    "(attributes a SessionRepoSession does not have)"
)
_OWN_SQL = "asserts the SQL statements SQLAlchemySession issues"

FRAMEWORKS: dict[str, Framework] = {
    "openai-agents": Framework(
        name="openai-agents",
        shim="shim_openai_agents",
        files=(
            "tests/memory/test_session.py",
            "tests/memory/test_session_limit.py",
            "tests/extensions/memory/test_sqlalchemy_session.py",
        ),
        deselected={
            "tests/memory/test_session.py::test_sqlite_session_close_closes_worker_thread_connections": _SQLITE_INTERNALS,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_reaps_connections_from_exited_worker_threads": _SQLITE_INTERNALS,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_closes_retired_connections_before_the_next_allocation": _SQLITE_INTERNALS,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_keeps_connections_of_live_worker_threads": _SQLITE_INTERNALS,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_file_lock_is_shared_across_instances": _SQLITE_INTERNALS,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_closed_rejects_empty_add_items": _SQLITE_ERROR_TEXT,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_pop_item_skips_corrupt_most_recent": _CORRUPT_ROWS,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": _CORRUPT_ROWS,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": _CORRUPT_ROWS,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": _CORRUPT_ROWS,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_failed_add_items_releases_write_lock": _FAULT_INJECTION,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_failed_clear_session_rolls_back": _FAULT_INJECTION,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_failed_pop_item_releases_write_lock": _FAULT_INJECTION,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_rollback_failure_evicts_connection": _FAULT_INJECTION,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_close_retries_quarantined_connection": _FAULT_INJECTION,  # noqa: E501
            "tests/memory/test_session.py::test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome": _FAULT_INJECTION,  # noqa: E501
            # A node id is a prefix: a parametrized test's every case.
            **{
                _SQLALCHEMY + test: reason
                for test, reason in {
                    "test_sqlalchemy_session_defaults_to_escaped_non_ascii_storage": _OWN_TABLES,
                    "test_sqlalchemy_session_can_store_non_ascii_without_escaping": _OWN_TABLES,
                    "test_get_items_same_timestamp_consistent_order": _OWN_TABLES,
                    "test_pop_item_same_timestamp_returns_latest": _OWN_TABLES,
                    "test_get_items_orders_by_id_for_ties": _OWN_TABLES,
                    "test_pop_item_skips_corrupt_most_recent": _CORRUPT_ROWS,
                    "test_get_items_limit_skips_corrupt_newest_rows": _CORRUPT_ROWS,
                    "test_pop_item_returns_none_after_dropping_only_corrupt_rows": _CORRUPT_ROWS,
                    "test_pop_item_supports_unknown_delete_rowcount": _FAULT_INJECTION,
                    "test_pop_item_retries_returning_claim_lost_to_concurrent_delete": (
                        _FAULT_INJECTION
                    ),
                    "test_mutation_cancellation_waits_for_transaction_exit": _FAULT_INJECTION,
                    "test_sqlite_fallback_reserves_writer_before_tail_claim": _OWN_SQL,
                    "test_add_items_waits_for_transient_sqlite_write_lock": _OWN_ENGINE,
                    "test_add_items_concurrent_first_access_across_from_url_sessions": (
                        _OWN_ENGINE
                    ),
                    "test_add_items_concurrent_first_access_with_shared_session_cross_loop": (
                        _OWN_ENGINE
                    ),
                    "test_add_items_cancelled_waiter_does_not_strand_table_init_lock": (
                        _OWN_ENGINE
                    ),
                    "test_create_tables_false_does_not_allocate_shared_init_lock": _OWN_ENGINE,
                    "test_engine_property_from_url": _OWN_ENGINE,
                    "test_engine_property_from_external_engine": _OWN_ENGINE,
                    "test_engine_property_is_read_only": _OWN_ENGINE,
                    "test_sqlite_configuration_registry_releases_collected_engines": (_OWN_ENGINE),
                    "test_sqlite_configuration_registry_does_not_grow_unbounded": _OWN_ENGINE,
                }.items()
            },
        },
    ),
    "langchain-core": Framework(
        name="langchain-core",
        shim="shim_langchain",
        files=(
            "tests/unit_tests/chat_history/test_chat_history.py",
            "tests/unit_tests/runnables/test_history.py",
        ),
        # Their unit-test conftest needs their dev tools (blockbuster, pytest-mock); these
        # two files use none of its fixtures.
        options=("--noconftest",),
    ),
    "google-adk": Framework(
        name="google-adk",
        shim="shim_adk",
        files=("tests/unittests/sessions/test_session_service.py",),
    ),
}
ALIASES = {"openai-agents": "openai-agents", "langchain": "langchain-core", "adk": "google-adk"}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--quiet", *args], check=True)


def sdist_tests(framework: Framework, version: str, folder: Path) -> Path:
    """Their released sdist, unpacked: its root (holding ``tests/``)."""
    download = folder / "sdist"
    pip("download", "--no-binary", ":all:", "--no-deps", "-d", str(download),
        f"{framework.name}=={version}")  # fmt: skip
    (archive,) = download.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(folder / "src", filter="data")
    (root,) = (folder / "src").iterdir()
    missing = [name for name in framework.files if not (root / name).is_file()]
    if missing:
        raise SystemExit(f"{archive.name} holds no {', '.join(missing)}")
    return root


def checkout_tests(framework: Framework, checkout: Path, folder: Path) -> Path:
    """Their test files from a checkout (work tree) of the release, copied to ``folder``."""
    root = folder / "src"
    for name in framework.files:
        source = checkout / name
        if not source.is_file():
            raise SystemExit(f"{checkout} holds no {name}")
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        # The packages above it, so that relative imports of the tests resolve.
        for parent in Path(name).parents:
            init = checkout / parent / "__init__.py"
            if parent != Path(".") and init.is_file():
                shutil.copyfile(init, root / parent / "__init__.py")
    return root


@dataclass
class Outcome:
    test: str
    result: str  #: passed, failed, error, skipped, deselected
    detail: str = ""


def run_pytest(
    framework: Framework, root: Path, backend: str, site: Path, folder: Path
) -> list[Outcome]:
    report = folder / f"{backend}.xml"
    ini = folder / "pytest.ini"
    ini.write_text("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", framework.shim, "-p", "no:cacheprovider",
        "-c", str(ini), "--rootdir", str(root), f"--junitxml={report}",
        "-o", "junit_family=xunit1", *framework.options,
        *(option for test in framework.deselected for option in ("--deselect", test)),
        *framework.files,
    ]  # fmt: skip
    environment = dict(os.environ, SESSIONREPO_FRAMEWORK_BACKEND=backend)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(site), str(root), environment.get("PYTHONPATH", "")]
    )
    subprocess.run(command, cwd=root, env=environment, check=False)
    outcomes = [
        Outcome(test, "deselected", reason) for test, reason in framework.deselected.items()
    ]
    if not report.exists():
        return [*outcomes, Outcome("(collection)", "error", "pytest wrote no report")]
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        path = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        test = f"{path}::{case.get('name')}"
        result, detail = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                result = {"failure": "failed"}.get(kind, kind)
                detail = (element.get("message") or "").partition("\n")[0][:200]
        outcomes.append(Outcome(test, result, detail))
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgres"])
    parser.add_argument("--framework", action="append", choices=sorted(ALIASES))
    parser.add_argument("--adk-tests", type=Path, default=os.environ.get("ADK_TESTS") or None)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    arguments = parser.parse_args()
    backends = arguments.backend or ["sqlite", "postgres"]
    if "postgres" in backends and not os.environ.get("SESSIONREPO_TEST_POSTGRES_URL"):
        raise SystemExit("the postgres backend needs SESSIONREPO_TEST_POSTGRES_URL")
    chosen = [ALIASES[name] for name in arguments.framework or sorted(ALIASES)]
    work = arguments.keep or Path(tempfile.mkdtemp(prefix="sessionrepo-frameworks-"))
    work.mkdir(parents=True, exist_ok=True)
    site = work / "site"
    if not site.exists():
        pip("install", "--no-deps", "--target", str(site), PYTEST_ASYNCIO)
    totals = {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "deselected": 0}
    try:
        for name in chosen:
            framework = FRAMEWORKS[name]
            version = importlib.metadata.version(framework.name)
            folder = work / f"{framework.name}-{version}"
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir()
            if framework.name == "google-adk":
                if arguments.adk_tests is None:
                    print(
                        f"\n== google-adk {version}: not run: its sdist has no tests; give "
                        "--adk-tests (or ADK_TESTS=) a checkout of google/adk-python at "
                        f"v{version}"
                    )
                    continue
                root = checkout_tests(framework, arguments.adk_tests, folder)
            else:
                root = sdist_tests(framework, version, folder)
            for backend in backends:
                print(f"\n== {framework.name} {version} on {backend}", flush=True)
                outcomes = run_pytest(framework, root, backend, site, folder)
                for outcome in outcomes:
                    totals[outcome.result] += 1
                    detail = f"  ({outcome.detail})" if outcome.detail else ""
                    print(f"{outcome.result.upper():10} {outcome.test}{detail}")
                counts = {result: sum(o.result == result for o in outcomes) for result in totals}
                print(f"-- {framework.name} on {backend}: " + ", ".join(
                    f"{count} {result}" for result, count in counts.items()
                ))  # fmt: skip
    finally:
        if arguments.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    failed = totals["failed"] + totals["error"]
    print(
        f"\nframeworks: {totals['passed']} passed, {failed} failed, "
        f"{totals['skipped']} skipped, {totals['deselected']} deselected (do not apply)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
