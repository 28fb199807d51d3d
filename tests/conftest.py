"""One contract suite, every backend, both APIs.

The ``backend`` fixture is parametrized ``sqlite`` / ``postgres`` (with the matching
markers); every test that uses ``database_url`` or ``repo`` runs on both, each on a fresh
database whose schema came from ``alembic upgrade head``. In the modules marked
``contract``, every test that uses ``repo`` also runs on both APIs: ``sync`` (a
``SessionRepository``) and ``async`` (an ``AsyncSessionRepository``, whose coroutines the
test's plain calls run on an event loop of their own: see :class:`BlockingAsync`).

PostgreSQL comes from ``SESSIONREPO_TEST_POSTGRES_URL`` (a server where the tests may
create and drop databases); where that is unset and a Docker engine answers, from
testcontainers; otherwise the PostgreSQL tests are skipped, with the reason shown, unless
``SESSIONREPO_REQUIRE_POSTGRES=1`` (CI sets it), which turns the skip into a failure.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import threading
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from sqlalchemy.engine import make_url

from sessionrepo import SessionStore, open_async_repository, open_repository
from sessionrepo.store.database import Database
from sessionrepo.store.schema import upgrade

BACKENDS = [
    pytest.param("sqlite", marks=pytest.mark.sqlite),
    pytest.param("postgres", marks=pytest.mark.postgres),
]
T = TypeVar("T")
APIS = ["sync", pytest.param("async", marks=pytest.mark.asyncapi)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "repo" in metafunc.fixturenames and metafunc.definition.get_closest_marker("contract"):
        metafunc.parametrize("api", APIS)


def _require_postgres() -> bool:
    return os.environ.get("SESSIONREPO_REQUIRE_POSTGRES") == "1"


def _docker_answers() -> bool:
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    import docker  # testcontainers' dependency

    try:
        client = docker.from_env(timeout=3)
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


class PostgresServer:
    """A server on which each test gets its own database, cloned from a migrated template."""

    def __init__(self, admin_url: str) -> None:
        url = make_url(admin_url).set(drivername="postgresql")
        self.admin_url = url
        self._conninfo = url.render_as_string(hide_password=False)
        self.template = f"sessionrepo_template_{os.getpid()}"
        self._admin(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
        self._admin(f'CREATE DATABASE "{self.template}"')
        database = Database(self.url_for(self.template))
        try:
            upgrade(database)
        finally:
            database.dispose()

    def _admin(self, sql: str) -> None:
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def url_for(self, name: str) -> str:
        return self.admin_url.set(database=name).render_as_string(hide_password=False)

    def new_database(self, *, migrated: bool = True) -> str:
        name = f"sessionrepo_test_{uuid.uuid4().hex[:12]}"
        template = f' TEMPLATE "{self.template}"' if migrated else ""
        self._admin(f'CREATE DATABASE "{name}"{template}')
        return name

    def drop(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        self.drop(self.template)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    url = os.environ.get("SESSIONREPO_TEST_POSTGRES_URL")
    container = None
    if not url and _docker_answers():
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:15-alpine", driver=None).start()
        url = container.get_connection_url()
    if not url:
        reason = (
            "PostgreSQL tests need SESSIONREPO_TEST_POSTGRES_URL "
            "(e.g. postgresql://postgres@127.0.0.1:5432/postgres) or a Docker engine"
        )
        if _require_postgres():
            pytest.fail(f"SESSIONREPO_REQUIRE_POSTGRES=1 but: {reason}")
        pytest.skip(reason)
    try:
        server = PostgresServer(url)
    except psycopg.Error as exc:
        message = f"PostgreSQL at {make_url(url).render_as_string()} is unusable: {exc}"
        if _require_postgres():
            pytest.fail(message)
        pytest.skip(message)
    yield server
    server.close()
    if container is not None:
        container.stop()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    database = Database(f"sqlite:///{path}")
    try:
        upgrade(database)
    finally:
        database.dispose()
    return path


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database at the schema's head, on the test's backend."""
    if backend == "sqlite":
        path = tmp_path / "store.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = server.new_database()
    yield server.url_for(name)
    server.drop(name)


@pytest.fixture
def empty_database_url(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[str]:
    """A fresh database with no schema at all, on the test's backend."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = server.new_database(migrated=False)
    yield server.url_for(name)
    server.drop(name)


class EventLoopThread:
    """An event loop running in a thread of its own, for synchronous test code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class BlockingAsync:
    """An async object, called like its sync twin: each method call runs on the loop
    (a coroutine to its end; a plain method there too, as asyncio code would call it)."""

    def __init__(self, target: Any, loop: EventLoopThread) -> None:
        self._target = target
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            async def on_the_loop() -> Any:
                result = attribute(*args, **kwargs)
                return await result if inspect.isawaitable(result) else result

            return self._loop.run(on_the_loop())

        return call


@pytest.fixture(scope="session")
def event_loop_thread() -> Iterator[EventLoopThread]:
    loop = EventLoopThread()
    yield loop
    loop.close()


@pytest.fixture
def api() -> str:
    """``sync`` unless the module is marked ``contract`` (then both; see above)."""
    return "sync"


@pytest.fixture
def repo(database_url: str, api: str, request: pytest.FixtureRequest) -> Iterator[SessionStore]:
    if api == "sync":
        repository = open_repository(database_url)
        yield repository
        repository.close()
        return
    loop: EventLoopThread = request.getfixturevalue("event_loop_thread")
    async_repository = loop.run(open_async_repository(database_url))
    yield BlockingAsync(async_repository, loop)  # type: ignore[misc]
    loop.run(async_repository.close())
