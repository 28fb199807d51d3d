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

Citus: in the modules marked ``contract``, ``backend`` is also ``citus`` when
``SESSIONREPO_TEST_CITUS_URL`` names a Citus coordinator (or with
``SESSIONREPO_REQUIRE_CITUS=1``) (``tests/citus_cluster.py``
starts one). A database per test does not work there (the workers must know each
database), so each test gets a schema of its own instead, and a role of the same name
whose ``search_path`` is that schema: the test's URL names the role. Without the URL the
Citus tests (``tests/dialects/test_citus.py``) are skipped, with the reason shown;
``SESSIONREPO_REQUIRE_CITUS=1`` fails them.
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

from sessionrepo import (
    AsyncTranscriptWriter,
    Message,
    SessionRepository,
    SessionStore,
    TranscriptWriter,
    open_async_repository,
    open_repository,
)
from sessionrepo.store.database import Database
from sessionrepo.store.schema import upgrade

BACKENDS = [
    pytest.param("sqlite", marks=pytest.mark.sqlite),
    pytest.param("postgres", marks=pytest.mark.postgres),
]
CITUS = pytest.param("citus", marks=pytest.mark.citus)
T = TypeVar("T")
APIS = ["sync", pytest.param("async", marks=pytest.mark.asyncapi)]
#: The ways an append goes (``sessionrepo.store.append``): ``direct`` (the default: the
#: dialect's own statement, the locked path where it cannot decide alone) and
#: ``locked`` (every append in a transaction under the session's row lock).
APPEND_PATHS = ["direct", "locked"]
#: The contract modules whose ``repo`` tests run on both append paths.
APPEND_PATH_MODULES = frozenset(
    {"test_append", "test_boundary", "test_faithful_storage", "test_concurrency", "test_rollup"}
)


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    contract = metafunc.definition.get_closest_marker("contract") is not None
    if not contract and not _runs_on_citus_too(metafunc):
        return
    if contract and "repo" in metafunc.fixturenames:
        metafunc.parametrize("api", APIS)
        if metafunc.module.__name__.rpartition(".")[2] in APPEND_PATH_MODULES:
            metafunc.parametrize("append_path", APPEND_PATHS)
    chosen = any(
        "backend" in str(marker.args[0])
        for marker in metafunc.definition.iter_markers("parametrize")
    )
    wanted = os.environ.get("SESSIONREPO_TEST_CITUS_URL") or _require_citus()
    if "backend" in metafunc.fixturenames and wanted and not chosen:
        # The contract runs on Citus too (a test that chose its backends keeps them).
        # Without a coordinator, tests/dialects/test_citus.py shows the reason it is skipped.
        # Module-scoped for the adapters: a module may scope its own ``backend`` and
        # database fixtures (one database per module).
        metafunc.parametrize("backend", [*BACKENDS, CITUS], scope=None if contract else "module")


#: Beside the contract suite, what runs on Citus too: the framework adapters (ADK,
#: LangChain, OpenAI Agents), whose tables and statements are sessionrepo's.
CITUS_TOO_DIRECTORIES = ("integrations",)


def _runs_on_citus_too(metafunc: pytest.Metafunc) -> bool:
    return Path(str(metafunc.definition.path)).parent.name in CITUS_TOO_DIRECTORIES


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


class CitusServer:
    """A Citus coordinator on which each test gets a schema (and a role) of its own.

    Making one costs about two seconds (the migrations, the distribution, and dropping it
    again), several times what most tests take. So a migrated schema a test gave back
    unchanged (its tables, columns, indexes, constraints and distribution as they were
    made: :meth:`_shape`) is emptied and given to the next test; one that a test changed
    (a dropped index, a damaged search table) is dropped.
    """

    def __init__(self, admin_url: str) -> None:
        self.admin_url = make_url(admin_url).set(drivername="postgresql")
        self._conninfo = self.admin_url.render_as_string(hide_password=False)
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'citus'")
            found = row.fetchone()
            if found is None:
                raise LookupError("it has no citus extension")
            self.version = str(found[0])
        self._shapes: dict[str, str] = {}  # migrated schemas handed out, by URL
        self._free: list[str] = []

    def _admin(self, *statements: str) -> None:
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            for sql in statements:
                conn.execute(sql)  # type: ignore[arg-type]

    def _shape(self, name: str) -> str:
        """Everything a test could change about a schema's objects, as one string."""
        query = f"""
            SELECT string_agg(item, ' | ' ORDER BY item) FROM (
              SELECT c.relname || ':' || c.relkind::text AS item FROM pg_class c
               WHERE c.relnamespace = '{name}'::regnamespace
              UNION ALL
              SELECT c.relname || '.' || a.attname || ':' || format_type(a.atttypid, a.atttypmod)
                FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
               WHERE c.relnamespace = '{name}'::regnamespace AND a.attnum > 0
                 AND NOT a.attisdropped
              UNION ALL
              SELECT conname || ':' || pg_get_constraintdef(oid) FROM pg_constraint
               WHERE connamespace = '{name}'::regnamespace
              UNION ALL
              SELECT indexdef FROM pg_indexes WHERE schemaname = '{name}'
              UNION ALL
              SELECT p.logicalrelid::text || ':' || p.partmethod::text || ':' || p.colocationid
                FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
               WHERE c.relnamespace = '{name}'::regnamespace
            ) objects
        """
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            row = conn.execute(query).fetchone()  # type: ignore[call-overload]
        return str(row[0] if row else "")

    def _tables(self, name: str) -> list[str]:
        """The schema's tables but ``alembic_version``, each after every table that has a
        foreign key to it (the ones that point first)."""
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            tables = [
                str(row[0])
                for row in conn.execute(
                    "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace "
                    "AND relkind IN ('r', 'p') AND relname <> 'alembic_version' ORDER BY relname",
                    [name],
                )
            ]
            edges = conn.execute(
                "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint "
                "WHERE contype = 'f' AND connamespace = %s::regnamespace",
                [name],
            ).fetchall()
        points_to: dict[str, set[str]] = {table: set() for table in tables}
        for child_name, parent_name in edges:
            child = child_name.split(".")[-1].strip('"')
            parent = parent_name.split(".")[-1].strip('"')
            if child in points_to and parent != child:
                points_to[child].add(parent)
        ordered: list[str] = []
        while points_to:
            # Next: the tables no remaining table points to.
            pointed = {parent for parents in points_to.values() for parent in parents}
            free = sorted(table for table in points_to if table not in pointed)
            if not free:  # a cycle: delete in any order (it was none so far)
                free = sorted(points_to)
            ordered += free
            for table in free:
                del points_to[table]
        return ordered

    def new_schema(self, *, migrated: bool = True) -> str:
        """A schema at the head revision (or empty), and a superuser of the same name
        whose ``search_path`` is that schema; returns the URL that connects as it."""
        if migrated and self._free:
            return self._free.pop()
        name = f"sessionrepo_t_{uuid.uuid4().hex[:12]}"
        self._admin(
            f'CREATE ROLE "{name}" LOGIN SUPERUSER',
            f'CREATE SCHEMA "{name}" AUTHORIZATION "{name}"',
            f'ALTER ROLE "{name}" SET search_path = "{name}"',
        )
        url = self.admin_url.set(username=name).render_as_string(hide_password=False)
        if migrated:
            database = Database(url)
            try:
                upgrade(database)
            finally:
                database.dispose()
            self._shapes[url] = self._shape(name)
        return url

    def release(self, url: str) -> None:
        """Take back a test's schema: emptied for the next test if it is as it was
        made, else dropped."""
        name = make_url(url).username
        self._admin(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
            f"WHERE usename = '{name}' AND pid <> pg_backend_pid()"
        )
        shape = self._shapes.get(url)
        if shape is not None and shape == self._shape(str(name)):
            # DELETE, not TRUNCATE: on a few rows it costs a tenth (no lock taken on
            # every shard of every table, no file swapped). Every table of the schema
            # (the ADK state's too), those with foreign keys before what they point to,
            # but the store's tombstone key, which its migration made (a store has one).
            tables = [table for table in self._tables(str(name)) if table != "privacy_keys"]
            self._admin(
                f'SET search_path = "{name}"; '
                + "".join(f'DELETE FROM "{table}"; ' for table in tables)
                + "INSERT INTO search_index_state (name, state, reason, updated_at) "
                "VALUES ('messages', 'ok', NULL, now())"
            )
            self._free.append(url)
            return
        self.drop(url)

    def drop(self, url: str) -> None:
        name = make_url(url).username
        self._shapes.pop(url, None)
        self._admin(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
            f"WHERE usename = '{name}' AND pid <> pg_backend_pid()",
            f'DROP SCHEMA IF EXISTS "{name}" CASCADE',
            f'DROP ROLE IF EXISTS "{name}"',
        )

    def close(self) -> None:
        for url in list(self._shapes):
            self.drop(url)
        self._free.clear()


def _require_citus() -> bool:
    return os.environ.get("SESSIONREPO_REQUIRE_CITUS") == "1"


@pytest.fixture(scope="session")
def citus_server() -> Iterator[CitusServer]:
    url = os.environ.get("SESSIONREPO_TEST_CITUS_URL")
    if not url:
        reason = (
            "Citus tests need SESSIONREPO_TEST_CITUS_URL naming a Citus coordinator "
            "(python tests/citus_cluster.py start prints one)"
        )
        if _require_citus():
            pytest.fail(f"SESSIONREPO_REQUIRE_CITUS=1 but: {reason}")
        pytest.skip(reason)
    try:
        server = CitusServer(url)
    except (psycopg.Error, LookupError) as exc:
        message = f"Citus at {make_url(url).render_as_string()} is unusable: {exc}"
        if _require_citus():
            pytest.fail(message)
        pytest.skip(message)
    yield server
    server.close()


@pytest.fixture
def citus_url(citus_server: CitusServer) -> Iterator[str]:
    """A migrated schema of its own on the Citus coordinator, given back at the end."""
    url = citus_server.new_schema()
    yield url
    citus_server.release(url)


@pytest.fixture
def empty_citus_url(citus_server: CitusServer) -> Iterator[str]:
    """A schema of its own on the Citus coordinator, not migrated, dropped at the end."""
    url = citus_server.new_schema(migrated=False)
    yield url
    citus_server.drop(url)


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
    if backend == "citus":
        citus: CitusServer = request.getfixturevalue("citus_server")
        url = citus.new_schema()
        yield url
        citus.release(url)
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
    if backend == "citus":
        citus: CitusServer = request.getfixturevalue("citus_server")
        url = citus.new_schema(migrated=False)
        yield url
        citus.drop(url)
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


def open_for_api(url: str, api: str, request: pytest.FixtureRequest, **options: Any) -> Any:
    """A repository of ``url`` through the ``sync`` API, or the ``async`` one called like
    it (:class:`BlockingAsync`), closed when the test ends."""
    if api == "sync":
        repository = open_repository(url, **options)
        request.addfinalizer(repository.close)
        return repository
    loop: EventLoopThread = request.getfixturevalue("event_loop_thread")
    async_repository = loop.run(open_async_repository(url, **options))
    request.addfinalizer(lambda: loop.run(async_repository.close()))
    return BlockingAsync(async_repository, loop)


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
def append_path() -> str:
    """``direct`` unless the module is one of :data:`APPEND_PATH_MODULES` (then both)."""
    return "direct"


def take_path(repository: SessionRepository, append_path: str) -> SessionRepository:
    """``repository`` with its appends sent the ``append_path`` way: ``locked`` turns
    the direct statement off (the store's own switch, for the contract suite)."""
    repository._appender.direct = repository._appender.direct and append_path == "direct"
    return repository


@pytest.fixture
def repo(
    database_url: str, api: str, append_path: str, request: pytest.FixtureRequest
) -> Iterator[SessionStore]:
    if api == "sync":
        repository = take_path(open_repository(database_url), append_path)
        yield repository
        repository.close()
        return
    loop: EventLoopThread = request.getfixturevalue("event_loop_thread")
    async_repository = loop.run(open_async_repository(database_url))
    take_path(async_repository._sync, append_path)
    yield BlockingAsync(async_repository, loop)  # type: ignore[misc]
    loop.run(async_repository.close())


@pytest.fixture
def writer(repo: Any, api: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A ``TranscriptWriter`` over ``repo`` on the test's API (its outbox in the same
    database: the write path is the same for a SQLite outbox file)."""
    if api == "sync":
        sync = TranscriptWriter(repo)
        yield sync
        sync.close()
        return
    loop: EventLoopThread = request.getfixturevalue("event_loop_thread")

    async def make() -> AsyncTranscriptWriter:
        return AsyncTranscriptWriter(repo._target)

    async_writer = loop.run(make())
    yield BlockingAsync(async_writer, loop)
    loop.run(async_writer.close())


@pytest.fixture
def indexed(database_url: str) -> Iterator[SessionRepository]:
    """A repository whose search index holds one message ("hello there", session "s")."""
    repository = open_repository(database_url)
    repository.append("s", [Message(role="user", content="hello there")])
    assert [hit.seq for hit in repository.search("hello")] == [1]
    yield repository
    repository.close()


# -- the operator tools' tests (tests/ops): a store and a store on the other backend ----


@pytest.fixture
def other_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database at the schema's head on the *other* backend (PostgreSQL for a
    SQLite test, SQLite for a PostgreSQL one)."""
    if backend == "sqlite":
        server = request.getfixturevalue("postgres_server")
        name = server.new_database()
        yield server.url_for(name)
        server.drop(name)
        return
    path = tmp_path / "other.db"
    shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
    yield f"sqlite:///{path}"


@pytest.fixture
def source(database_url: str) -> Iterator[SessionRepository]:
    """A repository on the test's backend."""
    repository = open_repository(database_url)
    yield repository
    repository.close()


@pytest.fixture
def target(other_url: str) -> Iterator[SessionRepository]:
    """A repository on the other backend."""
    repository = open_repository(other_url)
    yield repository
    repository.close()
