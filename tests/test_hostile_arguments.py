"""Every public entry point, called with hostile arguments, on both backends and both APIs.

For each public method of :class:`SessionRepository`, :class:`TranscriptWriter` and their
asyncio twins, Hypothesis draws arguments from pools of values a careless or hostile
caller hands over (wrong types, bools for ints, integers past 64 bits, NaN and
infinities, lone surrogates, NUL, very long strings, negative numbers, naive datetimes,
``None``), mixed with well-formed ones so that every argument, not just the first, gets
reached. One drawn call runs on a SQLite store and a PostgreSQL store, through the sync
and the async API, and must:

- end in a :class:`RepoError` (or a correct answer), never another exception;
- end the same way on both backends (the same error class, or both answering);
- leave search available to everyone: a real search still finds the known hit.

The stores are shared by every example (one SQLite file, one PostgreSQL database, for
the module), so the run stays short. Ids are drawn so that the known session is never
edited; every call touches the same other sessions on both backends, whose states so
stay alike.

The entry points are found by introspection: a public method that no strategy covers
(a new one, or one with a new argument) fails :func:`test_every_public_entry_point_is_covered`.
"""

from __future__ import annotations

import inspect
import math
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionrepo import (
    AsyncSessionRepository,
    AsyncTranscriptWriter,
    Message,
    SessionRepository,
    TranscriptWriter,
    open_async_repository,
    open_repository,
)
from sessionrepo.errors import QueuedBehindOutbox, RepoError
from sessionrepo.models import Session
from sessionrepo.store.repository import SessionFilter, SessionSnapshot
from tests.conftest import BlockingAsync, EventLoopThread, PostgresServer

pytestmark = [pytest.mark.postgres, pytest.mark.sqlite]

#: The session every example must still find by search afterwards; never edited.
KNOWN: Final = "known"
KNOWN_WORD: Final = "mochi"

# -- the pools ------------------------------------------------------------------------

NOW: Final = datetime(2026, 1, 1, tzinfo=UTC)

#: Values of the wrong kind for almost any argument.
wrong = st.sampled_from(
    [
        None,
        True,
        False,
        b"bytes",
        bytearray(b"x"),
        [],
        {},
        (),
        {1, 2},
        object(),
        1.5,
        math.nan,
        math.inf,
        -math.inf,
        -0.0,
        complex(1, 1),
        uuid.UUID(int=7),
        NOW.replace(tzinfo=None),  # naive
        NOW,
        "2020-01-01",
        Path("/tmp"),
        print,
    ]
)
#: Integers around every boundary: negative, zero, 64-bit limits, far past them.
integers = st.one_of(
    st.sampled_from([0, 1, -1, 2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**40]),
    st.integers(min_value=-5, max_value=5),
)
#: Strings no column can hold, or that a careless layer mishandles.
bad_strings = st.sampled_from(
    [
        "",
        " ",
        "\ud800",
        "a\udfffb",
        "a\x00b",
        "\x00",
        "\x1b[31m",
        "x" * 70_000,
        "'; DROP TABLE messages; --",
        '" OR 1=1 --',
        "%_\\",
        "\u202e\ufeff",
        "NEAR(a b)",
        "*",
    ]
)
hostile = st.one_of(wrong, integers, bad_strings)


def _or_hostile(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, hostile)


#: Ids of the sessions the examples may touch (never KNOWN).
scratch_ids = st.sampled_from(["scratch-a", "scratch-b", "nosuch"])
session_ids = _or_hostile(scratch_ids)
optional_session_ids = st.one_of(st.none(), session_ids)
filters = _or_hostile(st.sampled_from([None, "cli", "user", "u1"]))
seqs = _or_hostile(st.integers(min_value=0, max_value=4))
times = _or_hostile(st.sampled_from([NOW, NOW - timedelta(days=1), 1_700_000_000.0]))
message_dicts = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": hostile}),
    st.fixed_dictionaries({"role": hostile, "content": st.just("hi")}),
    st.just({"role": "user", "content": "fine words"}),
    st.just({"role": "tool", "content": "x", "tool_call_id": "\ud800"}),
    st.just({"role": "user", "content": "x", "client_msg_uuid": "not-a-uuid"}),
    st.just({"role": "user", "content": "x", "timestamp": NOW.replace(tzinfo=None)}),
    st.just({"role": "user", "content": "x", "extra_field": math.nan}),
    hostile,
)
messages = _or_hostile(st.lists(message_dicts, max_size=3))
session_fields = st.dictionaries(
    st.sampled_from(["source", "user_id", "title", "metadata", "model_config", "message_count"]),
    hostile,
    max_size=2,
)

#: A stand-in for a batch ``prepare`` makes (built from the drawn messages at call time).
BATCH: Final = object()

#: The pool of each argument, by name; ``**kwargs`` parameters are named ``**name``.
POOLS: Final[dict[str, st.SearchStrategy[Any]]] = {
    "session_id": session_ids,
    "source_id": session_ids,
    "new_id": session_ids,
    "messages": messages,
    "summary_message": _or_hostile(message_dicts),
    "keys": _or_hostile(st.lists(_or_hostile(st.just(str(uuid.UUID(int=1)))), max_size=2)),
    "to_seq": seqs,
    "at_seq": seqs,
    "through_seq": seqs,
    "after_seq": st.one_of(st.none(), seqs),
    "before_seq": st.one_of(st.none(), seqs),
    "limit": _or_hostile(st.sampled_from([None, 1, 10])),
    "include_ancestors": _or_hostile(st.booleans()),
    "include_retracted": _or_hostile(st.booleans()),
    "query": _or_hostile(st.sampled_from([KNOWN_WORD, "-mochi", '"a b"', "x*"])),
    "source": filters,
    "user_id": filters,
    "role": _or_hostile(st.sampled_from([None, "user", "tool"])),
    "status": _or_hostile(st.sampled_from([None, "open", "ended"])),
    "since": st.one_of(st.none(), times),
    "until": st.one_of(st.none(), times),
    "order": _or_hostile(st.sampled_from(["rank", "newest"])),
    "cursor": _or_hostile(st.sampled_from([None, 0, "1"])),
    "reason": _or_hostile(st.just("done")),
    "on_conflict": _or_hostile(st.sampled_from(["report", "raise"])),
    "batch": _or_hostile(st.just(BATCH)),
    "timeout": _or_hostile(st.sampled_from([None, 5.0])),
    "behind_outbox": _or_hostile(st.booleans()),
    "progress": _or_hostile(st.sampled_from([None, lambda done, total: None])),
    "selection": _or_hostile(
        st.builds(
            SessionFilter,
            session_ids=_or_hostile(st.just(("scratch-a",))),
            source=filters,
            status=_or_hostile(st.sampled_from([None, "open", "ended"])),
            ended_before=st.one_of(st.none(), times),
        )
    ),
    "after_id": optional_session_ids,
    "session_ids": _or_hostile(st.lists(session_ids, max_size=2)),
    "cutoff": times,
    "unchanged_from": _or_hostile(st.just({})),
    "snapshot": _or_hostile(
        st.builds(
            SessionSnapshot,
            st.builds(Session, id=scratch_ids, source=st.just("cli")),
            seqs,
        )
    ),
    "when": times,
    "stamped_since": times,
    "seconds": _or_hostile(st.just(5.0)),
    "interval": _or_hostile(st.just(0.01)),
    "ignore_backoff": _or_hostile(st.booleans()),
    "**fields": session_fields,
    "**session_defaults": session_fields,
    # The writer's constructor (the outbox file is another test's: on the primary here).
    "repository": st.just(None),
    "outbox_url": st.none(),
    "deadline": _or_hostile(st.just(5.0)),
    "max_attempts": _or_hostile(st.just(3)),
    "batch_size": _or_hostile(st.just(100)),
    "lease": _or_hostile(st.just(30.0)),
    "workers": _or_hostile(st.just(2)),
    "backoff_base": _or_hostile(st.just(0.1)),
    "backoff_cap": _or_hostile(st.just(1.0)),
    "probe_interval": _or_hostile(st.just(1.0)),
}

#: Public methods not called here, and why.
EXEMPT: Final = {
    "close": "ends the shared store: no argument to abuse (closing twice: test_boundary)",
    "start": "starts a background drainer thread or task (its interval: drain_round here)",
    "stop": "stops that drainer",
    "mark_superseded": "takes the caller's open Connection: the editing code's own helper",
    "bounded_database": "hands out a second pool; its seconds checked as writer deadlines are",
    "__aenter__": "context manager",
    "__aexit__": "context manager",
    "__enter__": "context manager",
    "__exit__": "context manager",
    "SessionRepository.__init__": "made by open_repository, whose arguments test_boundary checks",
    "AsyncSessionRepository.__init__": "made by open_async_repository, the same",
}

CLASSES: Final = (
    SessionRepository,
    AsyncSessionRepository,
    TranscriptWriter,
    AsyncTranscriptWriter,
)


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    methods = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(inspect.getattr_static(cls, name), property) or not callable(member):
            continue
        if name in EXEMPT or f"{cls.__name__}.{name}" in EXEMPT:
            continue
        methods[name] = inspect.signature(member)
    return methods


def _parameters(signature: inspect.Signature) -> list[tuple[str, inspect.Parameter]]:
    chosen = []
    for name, parameter in list(signature.parameters.items()):
        if name in {"self", "task_pool"}:  # task_pool: the async writer's own
            continue
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        key = f"**{name}" if parameter.kind is inspect.Parameter.VAR_KEYWORD else name
        chosen.append((key, parameter))
    return chosen


def test_every_public_entry_point_is_covered() -> None:
    """A public method (or argument) without a pool would escape the hostile test."""
    missing = {
        f"{cls.__name__}.{name}({key})"
        for cls in CLASSES
        for name, signature in _public_methods(cls).items()
        for key, _ in _parameters(signature)
        if key not in POOLS
    }
    assert not missing, f"no hostile strategy for: {sorted(missing)}"


# -- the stores -----------------------------------------------------------------------


@dataclass
class Store:
    """One backend: its sync and async repositories and writers, on one database."""

    backend: str
    repository: SessionRepository
    writer: TranscriptWriter
    async_repository: Any  # BlockingAsync(AsyncSessionRepository)
    async_writer: Any  # BlockingAsync(AsyncTranscriptWriter)

    def target(self, api: str, owner: str) -> Any:
        if owner == "repository":
            return self.repository if api == "sync" else self.async_repository
        return self.writer if api == "sync" else self.async_writer


@pytest.fixture(scope="module")
def stores(
    tmp_path_factory: pytest.TempPathFactory,
    sqlite_template: Path,
    postgres_server: PostgresServer,
    event_loop_thread: EventLoopThread,
) -> Iterator[dict[str, Store]]:
    import shutil

    path = tmp_path_factory.mktemp("hostile") / "store.db"
    shutil.copyfile(sqlite_template, path)
    name = postgres_server.new_database()
    urls = {"sqlite": f"sqlite:///{path}", "postgresql": postgres_server.url_for(name)}
    loop = event_loop_thread
    made: dict[str, Store] = {}
    try:
        for backend, url in urls.items():
            repository = open_repository(url)
            repository.append(
                KNOWN, [Message(role="user", content=f"hello {KNOWN_WORD}")], source="cli"
            )
            async_repository = loop.run(open_async_repository(url))

            async def writer_for(repo: AsyncSessionRepository = async_repository) -> Any:
                return AsyncTranscriptWriter(repo)

            made[backend] = Store(
                backend,
                repository,
                TranscriptWriter(repository),
                BlockingAsync(async_repository, loop),
                BlockingAsync(loop.run(writer_for()), loop),
            )
        yield made
    finally:
        for store in made.values():
            store.writer.close()
            store.async_writer.close()
            store.async_repository.close()
            store.repository.close()
        postgres_server.drop(name)


# -- the calls ------------------------------------------------------------------------

ENTRY_POINTS: Final = [
    (owner, name)
    for owner, cls in (("repository", SessionRepository), ("writer", TranscriptWriter))
    for name in sorted(_public_methods(cls))
]


def _draw_call(
    data: st.DataObject, signature: inspect.Signature
) -> tuple[list[Any], dict[str, Any]]:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for key, parameter in _parameters(signature):
        optional = parameter.default is not inspect.Parameter.empty
        if key.startswith("**"):
            kwargs.update(data.draw(POOLS[key], label=key))
            continue
        if optional and data.draw(st.booleans(), label=f"omit {key}"):
            continue
        value = data.draw(POOLS[key], label=key)
        if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and not optional:
            args.append(value)
        else:
            kwargs[key] = value
    return args, kwargs


def _outcome(call: Callable[[], Any]) -> tuple[str, str]:
    """``("ok", result type)`` or ``("raised", error class)``; any other exception fails."""
    try:
        result = call()
    except (RepoError, QueuedBehindOutbox) as exc:
        return ("raised", type(exc).__name__)
    return ("ok", type(result).__name__)


def _bound(
    store: Store, api: str, owner: str, name: str, *, args: list[Any], kwargs: dict[str, Any]
) -> Callable[[], Any]:
    """The drawn call, ready to run on ``store`` through ``api``."""
    kwargs = dict(kwargs)
    if kwargs.get("batch") is BATCH or BATCH in args:
        batch = store.repository.prepare("scratch-b", [{"role": "user", "content": "batched"}])
        args = [batch if value is BATCH else value for value in args]
        if kwargs.get("batch") is BATCH:
            kwargs["batch"] = batch
    if name == "__init__":  # a writer, made and closed at once
        args = args[1:]
        if api == "sync":

            def construct() -> TranscriptWriter:
                writer = TranscriptWriter(store.repository, *args, **kwargs)
                writer.close()
                return writer

            return construct
        accepted = inspect.signature(AsyncTranscriptWriter).parameters
        kwargs = {key: value for key, value in kwargs.items() if key in accepted}

        async def construct_async() -> AsyncTranscriptWriter:
            writer = AsyncTranscriptWriter(store.async_repository._target, *args, **kwargs)
            await writer.close()
            return writer

        return lambda: store.async_repository._loop.run(construct_async())
    method = getattr(store.target(api, owner), name)
    return lambda: method(*args, **kwargs)


def _has(api: str, owner: str, name: str) -> bool:
    """Whether the API has the method (``drain_round`` is the sync drainer's step)."""
    twins = {
        ("sync", "repository"): SessionRepository,
        ("async", "repository"): AsyncSessionRepository,
        ("sync", "writer"): TranscriptWriter,
        ("async", "writer"): AsyncTranscriptWriter,
    }
    return name in _public_methods(twins[api, owner])


def _search_still_answers(store: Store) -> None:
    hits = store.repository.search(KNOWN_WORD, session_id=KNOWN)
    assert [(hit.session_id, hit.seq) for hit in hits] == [(KNOWN, 1)], store.backend
    assert store.repository.search_index_state() == ("ok", None)


@pytest.mark.parametrize(("owner", "name"), ENTRY_POINTS, ids=[f"{o}.{n}" for o, n in ENTRY_POINTS])
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
@given(data=st.data())
def test_hostile_arguments(
    stores: dict[str, Store], owner: str, name: str, data: st.DataObject
) -> None:
    cls = SessionRepository if owner == "repository" else TranscriptWriter
    signature = _public_methods(cls)[name]
    args, kwargs = _draw_call(data, signature)
    for api in ("sync", "async"):
        if not _has(api, owner, name):
            continue
        outcomes = {
            backend: _outcome(_bound(store, api, owner, name, args=args, kwargs=kwargs))
            for backend, store in stores.items()
        }
        assert len(set(outcomes.values())) == 1, (api, name, outcomes)
    for store in stores.values():
        _search_still_answers(store)
