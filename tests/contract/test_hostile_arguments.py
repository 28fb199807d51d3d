"""Every public entry point, called with hostile arguments, on both backends and both APIs.

For each public method of :class:`SessionRepository`, :class:`TranscriptWriter` and their
asyncio twins, each example abuses one argument with a value a careless or hostile
caller hands over (wrong types, bools for ints, integers past 64 bits, NaN and
infinities, lone surrogates, NUL, very long strings, negative numbers, naive or extreme
datetimes, ``None``, malformed messages and selections) and gives the others as a
careful caller would, so that every argument, not just the first checked, is reached.
The drawn call runs on a SQLite store and a PostgreSQL store, through the sync and the
async API, and must:

- end in a :class:`RepoError` (or ``QueuedBehindOutbox``, the documented signal of
  ``append_prepared(behind_outbox=True)``) or an answer, never another exception;
- end the same way on both backends (the same error class, or answers of one type);
  a wrong type is refused as such by both APIs;
- leave search available to everyone: a real search still finds the known hit, and
  the index is not stale.

The stores are shared by every example (one SQLite file, one PostgreSQL database, for
the module), so the run stays short. Ids are drawn so that the known session is never
edited; every call touches the same other sessions on both backends, whose states so
stay alike.

The entry points are found by introspection: a public method that no strategy covers
(a new one, or one with a new argument) fails :func:`test_every_public_entry_point_is_covered`.
"""

from __future__ import annotations

import functools
import inspect
import math
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
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
    ensure_key,
    open_async_repository,
    open_repository,
)
from sessionrepo.errors import QueuedBehindOutbox, RepoError
from sessionrepo.models import Session
from sessionrepo.models.privacy import RetentionPolicy
from sessionrepo.models.transcript import is_sendable, transcript_problems
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


#: Ids of the sessions the examples may touch (never KNOWN).
scratch_ids = st.sampled_from(["scratch-a", "scratch-b", "nosuch"])
filters = st.sampled_from([None, "cli", "user", "u1"])
seqs = st.integers(min_value=0, max_value=4)
times = st.sampled_from([NOW, NOW - timedelta(days=1), 1_700_000_000.0])
#: Times that are valid but extreme, or not times at all for a store.
extreme_times = st.sampled_from(
    [
        -1e300,
        1e20,
        datetime.max.replace(tzinfo=UTC),
        datetime.min.replace(tzinfo=UTC),
        datetime.max.replace(tzinfo=timezone(-timedelta(hours=23))),  # past 9999 in UTC
        datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=23, minutes=59))),
    ]
)
valid_messages = st.lists(
    st.sampled_from(
        [
            {"role": "user", "content": "fine words"},
            {"role": "assistant", "content": "an answer"},
            Message(role="user", content="a valid message"),
        ]
    ),
    max_size=2,
)
hostile_message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": hostile}),
    st.fixed_dictionaries({"role": hostile, "content": st.just("hi")}),
    st.sampled_from(
        [
            {"role": "tool", "content": "x", "tool_call_id": "\ud800"},
            {"role": "user", "content": "x", "client_msg_uuid": "not-a-uuid"},
            {"role": "user", "content": "x", "timestamp": NOW.replace(tzinfo=None)},
            {"role": "user", "content": "x", "extra_field": math.nan},
            {
                "role": "user",
                "content": "x",
                "deep": functools.reduce(lambda x, _: [x], range(300), []),
            },
            {"role": "user", "content": "x", 1: "non-string key"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "\x00"}]},
            # Built without validation: the store validates again.
            Message.model_construct(role="user", content="\ud800"),
            Message.model_construct(role="user", content="x", timestamp=NOW.replace(tzinfo=None)),
        ]
    ),
    hostile,
)
hostile_messages = st.lists(
    st.one_of(hostile_message, valid_messages.map(lambda m: m[0] if m else {})),
    min_size=1,
    max_size=3,
)
session_fields = st.dictionaries(
    st.sampled_from(
        [
            "source",
            "user_id",
            "title",
            "metadata",
            "model_config",
            "parent_session_id",
            "started_at",
            "message_count",
            "next_seq",
            "ended_at",
            "id",
            "bogus",
        ]
    ),
    hostile,
    min_size=1,
    max_size=2,
)
valid_fields = st.sampled_from([{}, {"source": "cli"}, {"title": "a title", "user_id": "u1"}])

#: A stand-in for a batch ``prepare`` makes (built from the drawn messages at call time).
BATCH: Final = object()

#: What a careful caller passes, for each argument (by name; ``**kwargs`` parameters are
#: named ``**name``): the other arguments of a call take these, so that the one being
#: abused is reached.
VALID: Final[dict[str, st.SearchStrategy[Any]]] = {
    "session_id": scratch_ids,
    "source_id": scratch_ids,
    "new_id": scratch_ids,
    "messages": valid_messages,
    "summary_message": st.just({"role": "system", "content": "a summary"}),
    "keys": st.just([str(uuid.UUID(int=1))]),
    "to_seq": seqs,
    "at_seq": seqs,
    "through_seq": seqs,
    "after_seq": st.one_of(st.none(), seqs),
    "before_seq": st.one_of(st.none(), seqs),
    "limit": st.sampled_from([None, 1, 10]),
    "include_ancestors": st.booleans(),
    "include_retracted": st.booleans(),
    "query": st.sampled_from([KNOWN_WORD, "-mochi", '"a b"', "x*"]),
    "source": filters,
    "user_id": filters,
    "role": st.sampled_from([None, "user", "tool"]),
    "status": st.sampled_from([None, "open", "ended"]),
    "since": st.one_of(st.none(), times),
    "until": st.one_of(st.none(), times),
    "order": st.sampled_from(["rank", "newest"]),
    # Keyword only: a hybrid search would load the installed model in every example
    # (tests/search/test_semantic*.py cover the other modes).
    "mode": st.just("keyword"),
    "cursor": st.sampled_from([None, 0, "1"]),
    "reason": st.just("done"),
    "on_conflict": st.sampled_from(["report", "raise"]),
    "batch": st.just(BATCH),
    "timeout": st.sampled_from([None, 5.0]),
    "behind_outbox": st.booleans(),
    "create": st.booleans(),
    "progress": st.sampled_from([None, lambda done, total: None]),
    "fn": st.sampled_from([lambda repository: repository.backend]),
    "selection": st.one_of(
        st.none(),
        st.builds(SessionFilter, session_ids=st.just(("scratch-a",))),
        st.builds(SessionFilter, source=filters, status=st.sampled_from([None, "ended"])),
    ),
    "after_id": st.one_of(st.none(), scratch_ids),
    "session_ids": st.lists(scratch_ids, max_size=2),
    "cutoff": times,
    "unchanged_from": st.just({}),
    "snapshot": st.builds(
        SessionSnapshot, st.builds(Session, id=scratch_ids, source=st.just("cli")), st.just(1)
    ),
    "when": times,
    "stamped_since": times,
    "seconds": st.just(5.0),
    "interval": st.just(0.01),
    "ignore_backoff": st.booleans(),
    "usage": st.one_of(
        st.none(),
        st.builds(
            lambda tokens: [{"usage_id": str(uuid.uuid4()), "model": "m", "input_tokens": tokens}],
            st.integers(0, 10**6),
        ),
    ),
    # Erasure and retention: dry runs (what they check is the arguments; the erasing
    # itself is tests/ops/test_erase.py's).
    "dry_run": st.just(True),
    "actor": st.sampled_from([None, "ops@example.com"]),
    "scrub": st.just(False),
    "compact": st.just(False),
    "now": st.one_of(st.none(), times),
    "on_session": st.sampled_from([None, lambda session_id: None]),
    "policy": st.just(RetentionPolicy(source="hostile-test", idle_days=30)),
    "include_key": st.booleans(),
    "**fields": valid_fields,
    "**session_defaults": valid_fields,
    # The writer's constructor (the outbox file is another test's: on the primary here).
    "repository": st.just(None),
    "outbox_url": st.none(),
    "deadline": st.just(5.0),
    "max_attempts": st.just(3),
    "batch_size": st.just(100),
    "lease": st.just(30.0),
    "workers": st.just(2),
    "backoff_base": st.just(0.1),
    "backoff_cap": st.just(1.0),
    "probe_interval": st.just(1.0),
}

#: What is hostile for one argument in particular, beyond :data:`hostile`.
HOSTILE: Final[dict[str, st.SearchStrategy[Any]]] = {
    "messages": hostile_messages,
    "summary_message": hostile_message,
    "keys": st.lists(st.one_of(hostile, st.just(str(uuid.UUID(int=1)))), max_size=2),
    "since": extreme_times,
    "until": extreme_times,
    "cutoff": extreme_times,
    "when": extreme_times,
    "stamped_since": extreme_times,
    "now": extreme_times,
    "cursor": st.sampled_from(["-1", " 2 ", "1e3", "\u0661", "W1tdXQ", "9" * 30]),
    "selection": st.builds(
        SessionFilter,
        session_ids=st.one_of(hostile, st.lists(hostile, max_size=2).map(tuple)),
        source=hostile,
        user_id=hostile,
        status=hostile,
        ended_before=hostile,
        active_before=hostile,
    ),
    "session_ids": st.lists(st.one_of(hostile, scratch_ids), min_size=1, max_size=2),
    "snapshot": st.builds(
        SessionSnapshot,
        st.one_of(hostile, st.builds(Session, id=scratch_ids, source=st.just("cli"))),
        hostile,
    ),
    "unchanged_from": st.dictionaries(scratch_ids, hostile, max_size=1),
    "usage": st.one_of(
        st.lists(hostile, max_size=2),
        st.fixed_dictionaries(
            {"usage_id": st.one_of(hostile, st.just(str(uuid.UUID(int=7))))},
            optional={
                "model": hostile,
                "input_tokens": hostile,
                "latency": hostile,
                "occurred_at": hostile,
                "extra": hostile,
                "message_uuid": hostile,
            },
        ),
    ),
    "**fields": session_fields,
    "**session_defaults": session_fields,
    "outbox_url": st.just(None),  # files: another test's
    "repository": st.just(None),  # replaced by the store's (a hostile one: test_boundary)
}


def _hostile_for(key: str) -> st.SearchStrategy[Any]:
    if key in {"outbox_url", "repository"}:
        return HOSTILE[key]
    if key.startswith("**"):
        return HOSTILE[key]
    return st.one_of(hostile, HOSTILE[key]) if key in HOSTILE else hostile


#: Public methods not called here, and why.
EXEMPT: Final = {
    "close": "ends the shared store: no argument to abuse (closing twice: test_boundary)",
    "start": "starts a background drainer thread or task (its interval: drain_round here)",
    "stop": "stops that drainer",
    "mark_superseded": "takes the caller's open Connection: the editing code's own helper",
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
        if key not in VALID
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
    """One argument abused (drawn from the hostile pools), the others as a careful
    caller gives them (optional ones left out at random)."""
    parameters = _parameters(signature)
    target = data.draw(st.sampled_from([key for key, _ in parameters]), label="abused")
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for key, parameter in parameters:
        pool = _hostile_for(key) if key == target else VALID[key]
        if key.startswith("**"):
            kwargs.update(data.draw(pool, label=key))
            continue
        optional = parameter.default is not inspect.Parameter.empty
        if key != target and optional and data.draw(st.booleans(), label=f"omit {key}"):
            continue
        value = data.draw(pool, label=key)
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


TWINS: Final = {
    ("sync", "repository"): SessionRepository,
    ("async", "repository"): AsyncSessionRepository,
    ("sync", "writer"): TranscriptWriter,
    ("async", "writer"): AsyncTranscriptWriter,
}


def _has(api: str, owner: str, name: str) -> bool:
    """Whether the API has the method (``drain_round`` is the sync drainer's step)."""
    return name in _public_methods(TWINS[api, owner])


def _takes(owner: str, name: str, kwargs: dict[str, Any]) -> bool:
    """Whether the async twin takes all of ``kwargs``."""
    parameters = inspect.signature(getattr(TWINS["async", owner], name)).parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return True
    return set(kwargs) <= {parameter.name for parameter in parameters}


def _search_still_answers(store: Store) -> None:
    hits = store.repository.search(KNOWN_WORD, session_id=KNOWN)
    assert [(hit.session_id, hit.seq) for hit in hits] == [(KNOWN, 1)], store.backend
    assert store.repository.search_index_state() == ("ok", None)


#: Examples per entry point: a few for each argument it takes (each one gets abused).
EXAMPLES_PER_ARGUMENT: Final = 2


@pytest.mark.parametrize(("owner", "name"), ENTRY_POINTS, ids=[f"{o}.{n}" for o, n in ENTRY_POINTS])
def test_hostile_arguments(stores: dict[str, Store], owner: str, name: str) -> None:
    cls = SessionRepository if owner == "repository" else TranscriptWriter
    signature = _public_methods(cls)[name]
    arguments = len(_parameters(signature))

    @settings(
        max_examples=2 + EXAMPLES_PER_ARGUMENT * arguments,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
    )
    @given(data=st.data())
    def abuse(data: st.DataObject) -> None:
        args, kwargs = _draw_call(data, signature) if arguments else ([], {})
        seen: dict[str, tuple[str, str]] = {}
        for api in ("sync", "async"):
            if not _has(api, owner, name):
                continue
            outcomes = {
                backend: _outcome(_bound(store, api, owner, name, args=args, kwargs=kwargs))
                for backend, store in stores.items()
            }
            assert len(set(outcomes.values())) == 1, (api, name, outcomes)
            seen[api] = outcomes["sqlite"]
        # A wrong type is refused alike by both APIs (other outcomes may depend on what
        # the sync call, run first, changed), where both take the arguments (the async
        # writer has no ``workers``).
        wrong_type = ("raised", "ArgumentTypeError")
        if seen.get("sync") == wrong_type and "async" in seen and _takes(owner, name, kwargs):
            assert seen["async"] == wrong_type, (name, seen)
        for store in stores.values():
            _search_still_answers(store)

    abuse()


@pytest.mark.parametrize(
    "call",
    [
        lambda: ensure_key(None),  # type: ignore[arg-type]
        lambda: ensure_key("a message"),  # type: ignore[arg-type]
        lambda: ensure_key({"role": "user", "content": "hi", "client_msg_uuid": "nope"}),
        lambda: transcript_problems([None]),  # type: ignore[list-item]
        lambda: is_sendable([42]),  # type: ignore[list-item]
    ],
    ids=["ensure_key(None)", "ensure_key(str)", "ensure_key(bad key)", "problems", "sendable"],
)
def test_the_models_helpers_refuse_hostile_arguments_with_a_repo_error(
    call: Callable[[], object],
) -> None:
    # The helpers a gateway calls before any store (stamping, checking a transcript)
    # answer a wrong argument as the store does: a RepoError naming it.
    with pytest.raises(RepoError, match=r"message|client_msg_uuid"):
        call()
