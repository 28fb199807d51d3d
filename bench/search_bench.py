"""Full-text search benchmark (issue 4): load, search latency, append cost of the index.

Run ``python -m bench.search_bench`` (1,000,000 messages into each backend: 30 minutes on
a busy 2-CPU machine, more than half of it ``reindex``) or ``python -m bench.search_bench
--quick`` (10,000 messages, 15-60 seconds).
One run, on both backends (a SQLite file in a temporary directory, and a fresh PostgreSQL
database made with ``createdb``, migrated with ``sessionrepo migrate`` and dropped at the
end), does:

1. **Load**: ``--messages`` realistic messages (see :class:`Corpus`) over about 2,000
   sessions, appended in batches of up to 1,000 through ``open_repository(url,
   search_index=False)``, then ``repo.reindex()``. Both are timed.
2. **Search latency**: a fixed query set (:data:`QUERIES`), each query in both orders
   (``rank`` and ``newest``), ``limit=20``, warmed up, then timed end to end through
   ``repo.search`` ``--runs`` times: p50/p95 per query and over all of them. Each call
   is split into the time of its SQL statement and the rest of the call (snippets, the
   index state check); one whose p50 misses :data:`GOAL_P50_MS` has its plan kept
   (``EXPLAIN (ANALYZE, BUFFERS)`` on PostgreSQL, ``EXPLAIN QUERY PLAN`` on SQLite).
3. **Append cost of the index**: into the loaded store, ``--append-messages`` new
   messages per round, in batches of 10 and of 100, through ``open_repository(url)`` (the
   default: each append names its messages in the search backlog, A),
   ``search_index="immediate"`` (indexed in the append's transaction, I) and
   ``open_repository(url, search_index=False)`` (B), interleaved, ``--rounds`` rounds; the
   median messages/s of each and the ratio A/B. B as shipped also writes
   ``search_index_state`` after every append (it marks the index stale); the pure append
   path without that write is measured too (C), so the ratio against it is the whole cost
   of search on a write. After each round, ``catch_up_search_index()`` indexes that round's
   A messages, timed: the work moved off the append is reported, not hidden.

Results: ``bench/results/search-<time>.json`` and ``.md`` (``search-quick-…`` for
``--quick``), with the machine (CPUs, memory, CPU model, versions, PostgreSQL settings)
and the load average sampled through the run: the machine may be shared.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import platform
import random
import secrets
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event, text

from sessionrepo import SessionRepository, open_repository
from sessionrepo.models import Message
from sessionrepo.search import Query, parse_query

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
GOAL_P50_MS = 50.0
GOAL_APPEND_RATIO = 0.5
SEED = 20261129
_BASE_TIME = datetime(2026, 6, 1, tzinfo=UTC)

# -- the corpus ------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return text.split()


# Ranks 0..: the most common words of chat text, then a technical vocabulary, then
# phrases, a little Cyrillic, CJK and emoji; synthetic words fill the long tail. A word's
# weight is 1/(rank + 2.7) ** 1.07 (Zipf-like), so "the" is in nearly every message and
# the tail words in a handful.
_COMMON = _words(
    "the to and a of is in you that it for i this on with be can not are we have as if "
    "or your will do so but at an by from what all was me there my use one it's just like "
    "then now here out up which should need also get more how when some would could into "
    "no yes ok let see try make sure want think know because"
)
_TECHNICAL = _words(
    "error file python function database connection server request response config test "
    "user message session query index table value string list return import class method "
    "data code output input line path version install build run command model token api "
    "key json http port timeout retry cache memory thread process log debug warning "
    "exception traceback module package docker container deploy branch commit merge review "
    "issue bug fix feature update delete create insert select schema migration column row "
    "field type object array dict loop async await callback event handler queue worker job "
    "task schedule backup restore disk network latency throughput benchmark search result "
    "page cursor limit offset order rank sort filter source target channel discord "
    "telegram slack agent gateway transcript prompt assistant tool call argument parameter "
    "connect connected connector connecting connections conference console constant "
    "context continue postgres sqlite redis nginx linux kernel socket proxy certificate "
    "password login permission admin account email notification webhook payload header "
    "status code deadline lock transaction rollback replica primary standby vacuum "
    "analyze explain plan cost rows width buffer shared hit read written temp sorted "
    "hash join nested scan bitmap heap gin btree vector embedding prompt completion "
    "stream chunk retry backoff jitter circuit breaker health check metric trace span"
)
_PHRASES = (
    "connection refused",
    "out of memory",
    "pull request",
    "merge conflict",
    "stack trace",
    "unit test",
    "permission denied",
    "file not found",
    "rate limit",
    "thank you",
    "disk full",
    "segmentation fault",
)
_CYRILLIC = _words(
    "привет спасибо база данных ошибка сервер файл пожалуйста работает вопрос ответ "
    "проблема запрос поиск сообщение готово"
)
_CJK = (
    "東京",
    "数据库",
    "错误",
    "你好",
    "谢谢",
    "こんにちは",
    "ありがとう",
    "サーバー",
    "データ",
    "検索",
)
_EMOJI = ("🙂", "🚀", "👍", "🎉", "🔥", "✅", "😅", "🤔")
#: Planted in ``RARE_COUNT`` messages of any corpus (whatever its size): the rare word.
RARE_WORD = "quokkafjord"
RARE_COUNT = 20
_SYLLABLES = [c + v for c in "bdfghklmnprstvz" for v in "aeiou"] + ["an", "el", "or", "ix"]

_TOOL_NAMES = ("read_file", "run_shell", "query_db", "search_web", "fetch_url", "edit_file")
_SOURCES = ("discord", "telegram", "slack", "cli")
_SOURCE_WEIGHTS = (0.45, 0.25, 0.2, 0.1)

#: Log-normal (median, sigma) of text length in characters, per kind; clipped to
#: [50, 20,000]. With 1 in 400 tool outputs a 100 KB blob, the mean is about 1.3 KB.
_LENGTHS = {
    "system": (800, 0.6),
    "user": (340, 1.0),
    "assistant": (1_380, 0.9),
    "assistant_call": (120, 0.8),
    "tool": (1_400, 1.1),
}
_MIN_TEXT, _MAX_TEXT, _BIG_TOOL_OUTPUT = 50, 20_000, 100_000
_BIG_OUTPUT_CHANCE = 1 / 400
#: 1 in 8 assistant messages calls tools: one with calls is followed by its outputs and
#: then by one without, so a turn calls tools with chance p where p / (1 + p) = 1/8.
_TOOL_TURN_CHANCE = 1 / 7


def _vocabulary(rng: random.Random, size: int) -> tuple[list[str], list[float]]:
    words: list[str] = list(_COMMON)
    extras: list[tuple[int, str]] = []  # (rank, token) placed among the tail
    tech = list(_TECHNICAL)
    rng.shuffle(tech)
    for index, word in enumerate(tech):
        extras.append((len(_COMMON) + 5 + index * 4, word))
    for index, phrase in enumerate(_PHRASES):
        extras.append((400 + index * 150, phrase))
    for index, token in enumerate((*_CYRILLIC, *_CJK, *_EMOJI)):
        extras.append((700 + index * 170, token))
    seen = set(words) | {token for _, token in extras}
    tail: list[str] = []
    while len(tail) < size:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
        if word not in seen:
            seen.add(word)
            tail.append(word)
    extras.sort()
    tail.reverse()
    for rank, token in extras:
        while len(words) < rank and tail:
            words.append(tail.pop())
        words.append(token)
    tail.reverse()
    words += tail
    weights = [1.0 / (rank + 2.7) ** 1.07 for rank in range(len(words))]
    return words, weights


def _prose(rng: random.Random, tokens: int) -> str:
    words, weights = _vocabulary(rng, 60_000)
    cumulative = list(_accumulate(weights))
    chosen = rng.choices(words, cum_weights=cumulative, k=tokens)
    for index in range(0, tokens, 11):
        chosen[index] = chosen[index].capitalize()
    for index in range(10, tokens, 13):
        chosen[index] += "."
    for index in range(50, tokens, 97):
        chosen[index] += "\n"
    return " ".join(chosen)


def _accumulate(values: list[float]) -> Iterator[float]:
    total = 0.0
    for value in values:
        total += value
        yield total


def _logs(rng: random.Random, lines: int) -> str:
    levels = ("INFO", "INFO", "INFO", "DEBUG", "WARNING", "ERROR")
    paths = ("/api/v1/sessions", "/api/v1/messages", "/healthz", "/search", "/webhook")
    words = _TECHNICAL
    out: list[str] = []
    for number in range(lines):
        stamp = (_BASE_TIME + timedelta(seconds=number * 3)).strftime("%Y-%m-%dT%H:%M:%SZ")
        out.append(
            f"{stamp} {rng.choice(levels)} worker[{rng.randrange(32)}] "
            f"{rng.choice(words)} {rng.choice(words)} path={rng.choice(paths)} "
            f"status={rng.choice((200, 200, 201, 404, 500))} "
            f"latency_ms={rng.randrange(1, 900)} id={rng.getrandbits(48):012x}"
        )
    return "\n".join(out)


@dataclass
class Corpus:
    """Deterministic chat transcripts: the same seed gives the same messages.

    Text is sliced from two pre-generated buffers (Zipf-like prose and log lines), so
    generation costs little next to what is measured. Shape: per-role log-normal lengths
    from 50 B to 20 KB, 1 in 400 tool outputs 100 KB, 1 in 8 assistant messages with tool
    calls, 1 in 4 sessions opening with a system prompt, a little Cyrillic/CJK/emoji,
    :data:`RARE_WORD` in :data:`RARE_COUNT` messages.
    """

    total: int
    seed: int = SEED
    prose: str = field(init=False, repr=False)
    logs: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        tokens = min(16_000_000, max(400_000, self.total * 16))
        self.prose = _prose(rng, tokens)
        self.logs = _logs(rng, max(5_000, min(200_000, self.total // 5)))

    def _slice(self, rng: random.Random, buffer: str, length: int) -> str:
        length = min(length, len(buffer) - 1)
        start = rng.randrange(len(buffer) - length)
        space = buffer.find(" ", start, start + 40)
        if space >= 0 and space + 1 + length <= len(buffer):
            start = space + 1
        return buffer[start : start + length].strip() or "ok"

    def _text(self, rng: random.Random, kind: str) -> str:
        median, sigma = _LENGTHS[kind]
        length = int(rng.lognormvariate(math.log(median), sigma))
        length = max(_MIN_TEXT, min(_MAX_TEXT, length))
        if kind == "tool":
            if rng.random() < _BIG_OUTPUT_CHANCE:
                return self._slice(rng, self.logs, _BIG_TOOL_OUTPUT)
            if rng.random() < 0.5:
                return self._slice(rng, self.logs, length)
        return self._slice(rng, self.prose, length)

    def sessions(
        self, count: int, *, prefix: str = "s", seed: int | None = None
    ) -> Iterator[tuple[str, dict[str, Any], Iterator[Message]]]:
        """``(session_id, session_defaults, messages)`` for sessions totalling ``count``
        messages (mean ``self.total / 2000`` a session, at least 50)."""
        rng = random.Random(self.seed if seed is None else seed)
        rare_chance = RARE_COUNT / max(count, 1)
        mean = max(50.0, self.total / 2000)
        left = count
        number = 0
        while left > 0:
            size = max(3, min(left, int(rng.lognormvariate(math.log(mean / 1.65), 1.0))))
            left -= size
            session_id = f"{prefix}{number:05d}"
            number += 1
            source = rng.choices(_SOURCES, weights=_SOURCE_WEIGHTS)[0]
            defaults = {"source": source, "user_id": f"u{rng.randrange(300):03d}"}
            start = _BASE_TIME + timedelta(seconds=rng.uniform(0, 180 * 86400))
            session_rng = random.Random(rng.getrandbits(64))
            yield session_id, defaults, self._messages(session_rng, size, start, rare_chance)

    def _messages(
        self, rng: random.Random, size: int, start: datetime, rare_chance: float
    ) -> Iterator[Message]:
        clock = start
        made = 0

        def message(role: str, content: str | None, **fields: Any) -> Message:
            nonlocal clock, made
            clock += timedelta(seconds=rng.expovariate(1 / 40))
            made += 1
            if content is not None and rng.random() < rare_chance:
                cut = content.find(" ", len(content) // 2)
                cut = cut if cut >= 0 else len(content)
                content = f"{content[:cut]} {RARE_WORD}{content[cut:]}"
            return Message(
                client_msg_uuid=uuid.UUID(int=rng.getrandbits(128), version=4),
                role=role,
                content=content,
                timestamp=clock,
                **fields,
            )

        if rng.random() < 0.25:
            yield message("system", self._text(rng, "system"))
        while made < size:
            yield message("user", self._text(rng, "user"))
            if made < size and rng.random() < _TOOL_TURN_CHANCE:
                calls: list[dict[str, Any]] = [
                    {
                        "id": f"call_{rng.getrandbits(64):016x}",
                        "type": "function",
                        "function": {
                            "name": rng.choice(_TOOL_NAMES),
                            "arguments": json.dumps({"path": f"/srv/app/{rng.randrange(999)}"}),
                        },
                    }
                    for _ in range(rng.choice((1, 1, 1, 2)))
                ]
                said = self._text(rng, "assistant_call") if rng.random() < 0.5 else None
                yield message("assistant", said, tool_calls=calls, finish_reason="tool_calls")
                for call in calls:
                    if made >= size:
                        break
                    yield message(
                        "tool",
                        self._text(rng, "tool"),
                        tool_call_id=call["id"],
                        tool_name=call["function"]["name"],
                    )
            if made < size:
                yield message(
                    "assistant",
                    self._text(rng, "assistant"),
                    finish_reason="stop",
                    token_count=rng.randrange(20, 4000),
                )


def _batches(
    sessions: Iterator[tuple[str, dict[str, Any], Iterator[Message]]], size: int
) -> Iterator[tuple[str, dict[str, Any], list[Message]]]:
    for session_id, defaults, messages in sessions:
        batch: list[Message] = []
        for message in messages:
            batch.append(message)
            if len(batch) == size:
                yield session_id, defaults, batch
                batch = []
        if batch:
            yield session_id, defaults, batch


# -- the queries ---------------------------------------------------------------------


@dataclass(frozen=True)
class SearchCase:
    name: str
    query: str
    filters: dict[str, Any] = field(default_factory=dict)


def _queries(session_id: str) -> list[SearchCase]:
    return [
        SearchCase("rare word", RARE_WORD),
        SearchCase("medium word", "timeout"),
        SearchCase("very common word", "the"),
        SearchCase("two-word AND", "database timeout"),
        SearchCase("phrase", '"connection refused"'),
        SearchCase("prefix", "conn*"),
        SearchCase("exclusion", "database -postgres"),
        SearchCase("CJK", "東京"),
        SearchCase("Cyrillic", "ошибка"),
        SearchCase("session filter (medium)", "timeout", {"session_id": session_id}),
        SearchCase("session filter (common)", "the", {"session_id": session_id}),
        SearchCase("source filter", "timeout", {"source": "telegram"}),
    ]


QUERIES = _queries("<the largest session>")
ORDERS = ("rank", "newest")

# -- measurement helpers -------------------------------------------------------------


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class LoadSampler:
    """Samples the 1-minute load average every few seconds, labelled by phase."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self.phase = "start"
        self.samples: list[tuple[float, str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self.phase, os.getloadavg()[0]))
            self._stop.wait(self.interval)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.time(), self.phase, os.getloadavg()[0]))

    def summary(self) -> dict[str, Any]:
        by_phase: dict[str, list[float]] = {}
        for _, phase, load in self.samples:
            by_phase.setdefault(phase, []).append(load)
        loads = [load for _, _, load in self.samples]
        return {
            "overall": _load_stats(loads),
            "by_phase": {phase: _load_stats(values) for phase, values in by_phase.items()},
        }


def _load_stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "min": round(min(values), 2),
        "mean": round(statistics.fmean(values), 2),
        "max": round(max(values), 2),
    }


def _machine(postgres_url: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024**2, 1)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        root = Path(__file__).resolve().parent.parent
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        info["git"] = commit + (" (uncommitted changes)" if dirty else "")
    if postgres_url is not None:
        import psycopg

        with psycopg.connect(postgres_url, autocommit=True) as conn:
            info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            settings = conn.execute(
                "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)",
                (
                    [
                        "shared_buffers",
                        "work_mem",
                        "maintenance_work_mem",
                        "effective_cache_size",
                        "synchronous_commit",
                        "jit",
                        "max_parallel_workers_per_gather",
                        "gin_pending_list_limit",
                    ],
                ),
            ).fetchall()
            info["postgresql_settings"] = {
                name: f"{setting}{f' x {unit}' if unit else ''}" for name, setting, unit in settings
            }
    return info


# -- backends ------------------------------------------------------------------------


@dataclass
class Store:
    backend: str
    url: str
    cleanup: Callable[[], None]
    size: Callable[[], dict[str, int]]


@contextlib.contextmanager
def _sqlite_store() -> Iterator[Store]:
    directory = tempfile.mkdtemp(prefix="sr-search-bench-")
    path = Path(directory) / "search.db"

    def size() -> dict[str, int]:
        files = {p.name: p.stat().st_size for p in Path(directory).iterdir()}
        return {"file_bytes": sum(files.values())}

    try:
        yield Store("sqlite", f"sqlite:///{path}", lambda: None, size)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _postgres_tool(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def _postgres_store(server_url: str) -> Iterator[Store]:
    import psycopg
    from sqlalchemy.engine import make_url

    server = make_url(server_url)
    name = f"sr_search_bench_{os.getpid()}_{secrets.token_hex(3)}"
    common = ["-h", server.host or "127.0.0.1", "-p", str(server.port or 5432)]
    common += ["-U", server.username or "postgres"]
    _postgres_tool("createdb", *common, name)
    url = server.set(database=name).render_as_string(hide_password=False)
    libpq_url = url.replace("postgresql+psycopg://", "postgresql://")

    def size() -> dict[str, int]:
        with psycopg.connect(libpq_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_database_size(current_database()), "
                "pg_total_relation_size('messages'), pg_total_relation_size('message_search'), "
                "pg_relation_size('ix_message_search_document')"
            ).fetchone()
        assert row is not None
        keys = ("database_bytes", "messages_bytes", "message_search_bytes", "gin_index_bytes")
        return dict(zip(keys, row, strict=True))

    try:
        beside = Path(sys.executable).with_name("sessionrepo")
        command = str(beside) if beside.exists() else shutil.which("sessionrepo")
        if command is None:
            raise SystemExit("the sessionrepo command is not installed")
        subprocess.run([command, "--url", url, "migrate"], check=True, capture_output=True)
        yield Store("postgresql", url, lambda: None, size)
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _postgres_tool("dropdb", *common, "--force", "--if-exists", name)


# -- phases --------------------------------------------------------------------------


def _load(store: Store, corpus: Corpus) -> dict[str, Any]:
    """Bulk append without the index, then ``reindex``; both timed."""
    repo = open_repository(store.url, search_index=False)
    shape: dict[str, int] = {}
    appended = 0
    characters = 0
    append_seconds = 0.0
    batches = 0
    per_session: dict[str, int] = {}
    started = time.perf_counter()
    last_report = started
    try:
        for session_id, defaults, batch in _batches(corpus.sessions(corpus.total), 1000):
            _shape(shape, batch)
            characters += sum(len(m.content) for m in batch if isinstance(m.content, str))
            began = time.perf_counter()
            result = repo.append(session_id, batch, **defaults)
            append_seconds += time.perf_counter() - began
            appended += len(result.inserted)
            batches += 1
            per_session[session_id] = per_session.get(session_id, 0) + len(batch)
            if time.perf_counter() - last_report > 60:
                last_report = time.perf_counter()
                rate = appended / (last_report - started)
                _log(f"{store.backend}: loaded {appended:,} messages ({rate:,.0f}/s)")
        wall = time.perf_counter() - started
        _log(f"{store.backend}: loaded {appended:,} in {wall:.0f} s; reindexing")
        progress = _Progress(store.backend)
        began = time.perf_counter()
        indexed = repo.reindex(progress=progress)
        reindex_seconds = time.perf_counter() - began
        state = repo.search_index_state()
    finally:
        repo.close()
    _log(f"{store.backend}: reindexed {indexed:,} in {reindex_seconds:.0f} s")
    largest = max(per_session, key=per_session.__getitem__)
    return {
        "messages": appended,
        "sessions": len(per_session),
        "batches": batches,
        "shape": shape,
        "content_mb": round(characters / 1e6, 1),
        "mean_content_chars": round(characters / max(appended, 1)),
        "load_wall_s": round(wall, 1),
        "load_append_s": round(append_seconds, 1),
        "load_messages_per_s": round(appended / append_seconds),
        "load_mb_per_s": round(characters / 1e6 / append_seconds, 1),
        "reindex_s": round(reindex_seconds, 1),
        "reindex_messages_per_s": round(indexed / reindex_seconds),
        "reindex_mb_per_s": round(characters / 1e6 / reindex_seconds, 1),
        "indexed": indexed,
        "index_state_after": state[0],
        "largest_session": {"id": largest, "messages": per_session[largest]},
    }


def _shape(shape: dict[str, int], batch: list[Message]) -> None:
    for message in batch:
        content = message.content if isinstance(message.content, str) else ""
        for key, counts in (
            (f"role_{message.role}", True),
            ("assistant_with_tool_calls", bool(message.tool_calls)),
            ("content_100kb", len(content) >= _BIG_TOOL_OUTPUT),
            ("content_non_ascii", not content.isascii()),
        ):
            if counts:
                shape[key] = shape.get(key, 0) + 1


def _load_all(stores: list[Store], corpus: Corpus) -> list[dict[str, Any]]:
    """Load every store at once, one process each (forked: the corpus is shared)."""
    if len(stores) == 1:
        return [_load(stores[0], corpus)]
    context = multiprocessing.get_context("fork")
    pipes = []
    for store in stores:
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(target=_load_child, args=(store, corpus, sender), daemon=True)
        process.start()
        sender.close()
        pipes.append((process, receiver))
    results = []
    for process, receiver in pipes:
        outcome = receiver.recv()
        process.join()
        if isinstance(outcome, str):
            raise RuntimeError(f"a load failed:\n{outcome}")
        results.append(outcome)
    return results


def _load_child(store: Store, corpus: Corpus, sender: Any) -> None:
    try:
        sender.send(_load(store, corpus))
    except BaseException:
        sender.send(traceback.format_exc())
    finally:
        sender.close()


class _Progress:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.last = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if time.perf_counter() - self.last > 30:
            self.last = time.perf_counter()
            _log(f"{self.backend}: reindex {done:,}/{total:,}")


class _Capture:
    """Times the search statement inside each ``repo.search`` call and keeps the last
    one sent, to explain it.

    The time runs from the driver's ``execute`` to its return: psycopg has every row by
    then, and SQLite has stepped to the first row, which for these ``ORDER BY … LIMIT``
    statements means it has found and sorted every match. What a call takes beyond it
    is the repository's own work (the index state check, building the snippets).
    """

    def __init__(self, repo: SessionRepository) -> None:
        self.statement: str | None = None
        self.parameters: Any = None
        self.last_ms = 0.0
        self._started = 0.0
        engine = repo.database.engine
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    @staticmethod
    def _is_search(statement: str) -> bool:
        return any(
            mark in statement for mark in ("messages_fts MATCH", "message_search ms", ") top JOIN")
        )

    def reset(self) -> None:
        self.last_ms = 0.0

    def _before(self, conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if self._is_search(statement):
            self.statement, self.parameters = statement, parameters
            self._started = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if self._is_search(statement):  # a search may send several (a probe, the page)
            self.last_ms += (time.perf_counter() - self._started) * 1000


def _fts5_match(query: Query) -> str:
    """The FTS5 expression of a parsed query's terms, as the SQLite dialect writes it
    (the terms in column ``body``; the filters are joins here)."""

    def quoted(words: tuple[str, ...], prefix: bool) -> str:
        return 'body : "' + " ".join(words) + '"' + ("*" if prefix else "")

    expression = " AND ".join(quoted(term.words, term.prefix) for term in query.positive)
    for term in query.negative:
        expression = f"({expression}) NOT {quoted(term.words, term.prefix)}"
    return expression


def _match_count(repo: SessionRepository, case: SearchCase) -> int | None:
    """How many messages match (one count query, outside the timings)."""
    parsed = parse_query(case.query)
    clauses: list[str] = []
    params: dict[str, Any] = {}
    if "session_id" in case.filters:
        clauses.append("m.session_id = :sid")
        params["sid"] = case.filters["session_id"]
    if "source" in case.filters:
        clauses.append("s.source = :source")
        params["source"] = case.filters["source"]
    joins = (
        " JOIN messages m ON m.session_id = {a}.session_id AND m.seq = {a}.seq"
        " JOIN sessions s ON s.id = m.session_id"
    )
    where = "".join(f" AND {clause}" for clause in clauses)
    if repo.backend == "sqlite":
        params["q"] = _fts5_match(parsed)
        sql = (
            "SELECT count(*) FROM messages_fts f"
            + joins.format(a="f")
            + " WHERE messages_fts MATCH :q"
            + where
        )
    else:
        parts = []
        for index, term in enumerate(parsed.terms):
            params[f"t{index}"] = term.words[0] if term.prefix else " ".join(term.words)
            part = (
                f"to_tsquery('simple', quote_literal(:t{index}) || ':*')"
                if term.prefix
                else f"phraseto_tsquery('simple', :t{index})"
            )
            parts.append(f"!! {part}" if term.excluded else part)
        sql = (
            "SELECT count(*) FROM message_search ms"
            + joins.format(a="ms")
            + f" WHERE ms.document @@ ({' && '.join(parts)})"
            + where
        )
    try:
        with repo.database.engine.connect() as conn:
            return int(conn.execute(text(sql), params).scalar_one())
    except Exception as exc:  # a count is informative only
        _log(f"count for {case.name!r} failed: {exc}")
        return None


def _search_latency(
    store: Store,
    session_id: str,
    *,
    runs: int,
    time_cap: float,
    quick: bool,
    sampler: LoadSampler,
) -> dict[str, Any]:
    """p50/p95 of each query in each order; with ``quick``, one warm-up and no profiles."""
    sampler.phase = f"{store.backend}: search"
    repo = open_repository(store.url)
    capture = _Capture(repo)
    results: list[dict[str, Any]] = []
    try:
        for case in _queries(session_id):
            matches = _match_count(repo, case)
            for order in ORDERS:

                def once(case: SearchCase = case, order: str = order) -> int:
                    capture.reset()
                    hits = repo.search(case.query, order=order, limit=20, **case.filters)  # type: ignore[arg-type]
                    return len(hits)

                began = time.perf_counter()
                hits = once()  # warm-up (and the hit count)
                if quick is False and time.perf_counter() - began < 1.0:
                    once()  # a second one, unless a run costs seconds anyway
                # A query that takes seconds gets fewer runs (at least 3), not minutes.
                least = min(runs, 5 if time.perf_counter() - began < 5.0 else 3)
                timings: list[float] = []
                sql: list[float] = []
                began = time.perf_counter()
                while len(timings) < runs:
                    start = time.perf_counter()
                    once()
                    timings.append((time.perf_counter() - start) * 1000)
                    sql.append(capture.last_ms)
                    if time.perf_counter() - began > time_cap and len(timings) >= least:
                        break
                row: dict[str, Any] = {
                    "query": case.name,
                    "text": case.query,
                    "filters": sorted(case.filters),
                    "order": order,
                    "matches": matches,
                    "hits": hits,
                    "runs": len(timings),
                    "p50_ms": round(statistics.median(timings), 2),
                    "p95_ms": round(_percentile(timings, 0.95), 2),
                    "max_ms": round(max(timings), 2),
                    "sql_p50_ms": round(statistics.median(sql), 2),
                    "outside_sql_p50_ms": round(
                        statistics.median(t - q for t, q in zip(timings, sql, strict=True)), 2
                    ),
                    "timings_ms": [round(t, 2) for t in timings],
                }
                if row["p50_ms"] > GOAL_P50_MS and not quick:
                    row["plan"] = _plan(repo, capture)
                results.append(row)
                _log(
                    f"{store.backend}: {case.name} [{order}] p50 {row['p50_ms']:.1f} ms "
                    f"p95 {row['p95_ms']:.1f} ms ({matches} matches)"
                )
    finally:
        repo.close()
    return {"queries": results, "overall": _overall(results)}


def _overall(results: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for order in (*ORDERS, "all"):
        rows = [r for r in results if order in ("all", r["order"])]
        timings = [t for r in rows for t in r["timings_ms"]]
        if not timings:
            continue
        summary[order] = {
            "p50_ms": round(statistics.median(timings), 2),
            "p95_ms": round(_percentile(timings, 0.95), 2),
            "queries": len(rows),
            "queries_meeting_goal": sum(r["p50_ms"] <= GOAL_P50_MS for r in rows),
            "median_of_query_p50_ms": round(statistics.median(r["p50_ms"] for r in rows), 2),
        }
    return summary


def _plan(repo: SessionRepository, capture: _Capture) -> list[str]:
    """The plan of the last search statement: ``EXPLAIN (ANALYZE, BUFFERS)`` on
    PostgreSQL (it runs the statement once more), ``EXPLAIN QUERY PLAN`` on SQLite."""
    if capture.statement is None:
        return []
    explain = (
        "EXPLAIN (ANALYZE, BUFFERS) " if repo.backend == "postgresql" else "EXPLAIN QUERY PLAN "
    )
    with repo.database.engine.connect() as conn:
        rows = conn.exec_driver_sql(explain + capture.statement, capture.parameters).fetchall()
        conn.rollback()
    return [" | ".join(str(column) for column in row) for row in rows]


def _append_cost(
    store: Store,
    *,
    corpus: Corpus,
    session_ids: list[str],
    messages_per_round: dict[int, int],
    rounds: int,
    sampler: LoadSampler,
) -> dict[str, Any]:
    """Interleaved A (default: backlog) / I (immediate) / B (search_index=False), and the
    catch-up that indexes A's backlog after each round. (A variant without B's stale-state
    write would need to patch the store's privates: the bench uses the public API only.)"""
    sampler.phase = f"{store.backend}: append"
    variants: dict[str, dict[str, Any]] = {
        "A_indexed": {},
        "I_immediate": {"search_index": "immediate"},
        "B_search_index_false": {"search_index": False},
    }
    repos = {name: open_repository(store.url, **options) for name, options in variants.items()}
    out: dict[str, Any] = {}
    seed = SEED + 1
    try:
        for batch_size, count in messages_per_round.items():
            rates: dict[str, list[float]] = {name: [] for name in variants}
            catch_up: list[float] = []
            for round_number in range(rounds):
                for name, repo in repos.items():
                    seed += 1
                    work = _append_work(corpus, session_ids, count, batch_size, seed)
                    start = time.perf_counter()
                    inserted = 0
                    for session_id, batch in work:
                        inserted += len(repo.append(session_id, batch).inserted)
                    seconds = time.perf_counter() - start
                    rates[name].append(inserted / seconds)
                    _log(
                        f"{store.backend}: append x{batch_size} round {round_number + 1} "
                        f"{name}: {inserted / seconds:,.0f} msg/s"
                    )
                # The work A moved off the append: index its backlog (this round's
                # messages). B's appends marked the index stale, and a catch-up on a stale
                # index only drops its rows (the reindex redoes everything), so the state
                # is set back first: the indexing done is the same (this store is
                # thrown away after the run).
                _force_index_ok(repos["A_indexed"])
                start = time.perf_counter()
                indexed = repos["A_indexed"].catch_up_search_index()
                seconds = time.perf_counter() - start
                catch_up.append(indexed / seconds)
                _log(
                    f"{store.backend}: catch-up after x{batch_size} round {round_number + 1}: "
                    f"{indexed:,} messages, {indexed / seconds:,.0f} msg/s"
                )
            medians = {name: statistics.median(values) for name, values in rates.items()}
            catch_up_median = statistics.median(catch_up)
            a_rate = medians["A_indexed"]
            out[f"batch_{batch_size}"] = {
                "batch_size": batch_size,
                "messages_per_round": count,
                "rounds": rounds,
                "messages_per_s": {
                    name: [round(v) for v in values] for name, values in rates.items()
                }
                | {"catch_up": [round(v) for v in catch_up]},
                "median_messages_per_s": {name: round(v) for name, v in medians.items()}
                | {"catch_up": round(catch_up_median)},
                # Appending and then indexing every message, one after the other.
                "A_plus_catch_up_messages_per_s": round(1 / (1 / a_rate + 1 / catch_up_median)),
                "ratio_A_over_B": round(a_rate / medians["B_search_index_false"], 3),
                "ratio_I_over_B": round(
                    medians["I_immediate"] / medians["B_search_index_false"], 3
                ),
            }
    finally:
        for repo in repos.values():
            repo.close()
    return out


def _force_index_ok(repo: SessionRepository) -> None:
    # By the table's name, as third-party tools query it (the bench uses public names only).
    repo.database.write(
        lambda conn: conn.execute(text("UPDATE search_index_state SET state = 'ok', reason = NULL"))
    )


def _append_work(
    corpus: Corpus, session_ids: list[str], count: int, batch_size: int, seed: int
) -> list[tuple[str, list[Message]]]:
    """``count`` new messages in batches, into existing sessions (made before timing)."""
    work: list[tuple[str, list[Message]]] = []
    rng = random.Random(seed)
    stream = corpus.sessions(count, prefix=f"append{seed}-", seed=seed)
    messages = [message for _, _, session in stream for message in session]
    for start in range(0, len(messages), batch_size):
        work.append((rng.choice(session_ids), messages[start : start + batch_size]))
    return work


def _session_ids(store: Store, limit: int) -> list[str]:
    repo = open_repository(store.url, search_index=False)
    try:
        page = repo.list_sessions(limit=limit)
        return [summary.id for summary in page.sessions]
    finally:
        repo.close()


def _postgres_analyze(url: str) -> None:
    import psycopg

    with psycopg.connect(
        url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as conn:
        conn.execute("ANALYZE")


def _measure_backend(
    store: Store,
    load: dict[str, Any],
    corpus: Corpus,
    args: argparse.Namespace,
    sampler: LoadSampler,
) -> dict[str, Any]:
    report: dict[str, Any] = {"backend": store.backend, "load": load}
    began = time.perf_counter()
    if store.backend == "postgresql":
        # What autovacuum does soon after a bulk load anyway: without it the planner
        # believes the 1M-row tables hold a few dozen rows.
        began_analyze = time.perf_counter()
        _postgres_analyze(store.url)
        report["analyze_s"] = round(time.perf_counter() - began_analyze, 1)
    report["size_after_load"] = store.size()
    report["search"] = _search_latency(
        store,
        load["largest_session"]["id"],
        runs=args.runs,
        time_cap=args.time_cap,
        quick=args.quick,
        sampler=sampler,
    )
    report["search_wall_s"] = round(time.perf_counter() - began, 1)
    per_round = {10: args.append_messages // 4, 100: args.append_messages}
    report["append"] = _append_cost(
        store,
        corpus=corpus,
        session_ids=_session_ids(store, 200),
        messages_per_round=per_round,
        rounds=args.rounds,
        sampler=sampler,
    )
    report["measure_wall_s"] = round(time.perf_counter() - began, 1)
    report["append_wall_s"] = round(report["measure_wall_s"] - report["search_wall_s"], 1)
    return report


# -- output --------------------------------------------------------------------------


def _markdown(result: dict[str, Any]) -> str:
    machine = result["machine"]
    loads = result["load_average"]
    lines = [
        f"# Search benchmark ({'quick' if result['quick'] else 'full'}), {machine['date']}",
        "",
        f"Machine: {machine['nproc']} CPUs ({machine.get('cpu_model', '?')}), "
        f"{machine.get('memory_gib', '?')} GiB; PostgreSQL {machine.get('postgresql', '-')}, "
        f"SQLite {machine['sqlite']}, Python {machine['python']}; git "
        f"{machine.get('git', '?')}. Load average (1 min) during the run: "
        f"min {loads['overall'].get('min')}, mean {loads['overall'].get('mean')}, "
        f"max {loads['overall'].get('max')} (shared machine). Total wall time "
        f"{result['wall_s']:.0f} s.",
        "",
    ]
    backends = result["backends"]
    parallel = any(b["load"].get("parallel_with") for b in backends)
    lines += [
        "## Load",
        "",
        "Bulk append through `open_repository(url, search_index=False)` in batches of up to "
        "1,000 (one session per batch), then `repo.reindex()`"
        + (
            f"; the backends were loaded at the same time, one process each "
            f"({result['load_wall_s']:.0f} s for both), so each had about one of the CPUs"
            if parallel
            else ""
        )
        + ".",
        "",
        "| | " + " | ".join(b["backend"] for b in backends) + " |",
    ]
    lines.append("|---" * (len(backends) + 1) + "|")
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("messages / sessions", lambda b: f"{b['load']['messages']:,} / {b['load']['sessions']:,}"),
        ("shape", lambda b: _shape_text(b["load"])),
        (
            "content (mean per message)",
            lambda b: f"{b['load']['content_mb']:,} MB ({b['load']['mean_content_chars']:,} chars)",
        ),
        (
            "bulk append, no index (batches of 1,000)",
            lambda b: (
                f"{b['load']['load_append_s']:,} s: {b['load']['load_messages_per_s']:,} "
                f"msg/s, {b['load']['load_mb_per_s']} MB/s"
            ),
        ),
        (
            "reindex()",
            lambda b: (
                f"{b['load']['reindex_s']:,} s: {b['load']['reindex_messages_per_s']:,} "
                f"msg/s, {b['load']['reindex_mb_per_s']} MB/s"
            ),
        ),
        (
            "size after load",
            lambda b: ", ".join(f"{k} {v / 1e6:,.0f} MB" for k, v in b["size_after_load"].items()),
        ),
    ]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(b) for b in backends) + " |")
    lines += [
        "",
        f"## Search latency (ms, limit 20, end to end through `repo.search`; goal p50 ≤ "
        f"{GOAL_P50_MS:.0f} ms)",
        "",
    ]
    header = "| query | matches | " + " | ".join(
        f"{b['backend']} {order} p50 / p95" for b in backends for order in ORDERS
    )
    lines += [header + " |", "|---" * (2 + len(backends) * len(ORDERS)) + "|"]
    by_key = {
        (b["backend"], r["query"], r["order"]): r for b in backends for r in b["search"]["queries"]
    }
    for case in QUERIES:
        first = by_key.get((backends[0]["backend"], case.name, "rank"), {})
        counts = {
            str(by_key.get((b["backend"], case.name, "rank"), {}).get("matches")) for b in backends
        }
        cells = [f"`{case.query}`" + (f" + {', '.join(case.filters)}" if case.filters else "")]
        cells[0] = f"{case.name}: {cells[0]}"
        cells.append(" / ".join(sorted(counts)) if first else "-")
        for b in backends:
            for order in ORDERS:
                row = by_key.get((b["backend"], case.name, order))
                if row is None:
                    cells.append("-")
                    continue
                mark = "" if row["p50_ms"] <= GOAL_P50_MS else " ✗"
                cells.append(f"{row['p50_ms']:.1f} / {row['p95_ms']:.1f}{mark}")
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["**all queries** (pooled runs)", ""]
    for b in backends:
        for order in ORDERS:
            o = b["search"]["overall"].get(order, {})
            cells.append(
                f"**{o.get('p50_ms', 0):.1f} / {o.get('p95_ms', 0):.1f}** "
                f"({o.get('queries_meeting_goal')}/{o.get('queries')} meet goal)"
            )
    lines.append("| " + " | ".join(cells) + " |")
    runs = sorted({r["runs"] for b in backends for r in b["search"]["queries"]})
    lines += [
        "",
        f"Timed runs per query and order: {', '.join(map(str, runs))} (after one or two "
        f"warm-ups; runs stop after {result['settings']['time_cap_s']:.0f} s once 5 are made, 3 "
        "for a query whose first run took over 5 s). "
        "Matches: messages matching the query, counted once on each backend (one figure: "
        "both agree).",
    ]

    slow = [(b["backend"], r) for b in backends for r in b["search"]["queries"]]
    slow = [(backend, r) for backend, r in slow if r["p50_ms"] > GOAL_P50_MS]
    if slow:
        lines += [
            "",
            "### Queries over the goal: where the time goes (p50 ms)",
            "",
            "SQL: the search statements (on PostgreSQL a probe and the page), from the "
            "driver's execute to its return; outside: "
            "the rest of `repo.search` (index state check, snippets built in Python).",
            "",
            "| backend | query | order | p50 | SQL | outside SQL |",
            "|---|---|---|---|---|---|",
        ]
        for backend, r in slow:
            lines.append(
                f"| {backend} | {r['query']} | {r['order']} | {r['p50_ms']:.1f} | "
                f"{r['sql_p50_ms']:.1f} | {r['outside_sql_p50_ms']:.1f} |"
            )
        lines += ["", "Their plans are in the JSON file (`search.queries[].plan`)."]

    lines += [
        "",
        "## Append throughput with the index against without it (messages/s, median of "
        "rounds, interleaved)",
        "",
        "A: `open_repository(url)` (the default: an append names its messages in the "
        'search backlog, indexed later by a catch-up); I: `search_index="immediate"` '
        "(indexes in the append's transaction); B: `search_index=False` (as shipped: marks "
        "the index stale after each append, one more write); C: B without that write (the "
        "append path alone). Catch-up: `catch_up_search_index()` run after each round, "
        "indexing that round's A messages (the work A moved off the append, not removed: "
        "A+catch-up is appending then indexing every message, one after the other). "
        f"Goal A/B ≥ {GOAL_APPEND_RATIO}.",
        "",
        "| backend | batch | messages/round × rounds | A backlog | I immediate | B no index "
        "| catch-up | A+catch-up | A/B | I/B |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in backends:
        for entry in b["append"].values():
            med = entry["median_messages_per_s"]
            mark = "" if entry["ratio_A_over_B"] >= GOAL_APPEND_RATIO else " ✗"
            lines.append(
                f"| {b['backend']} | {entry['batch_size']} | {entry['messages_per_round']:,} × "
                f"{entry['rounds']} | {med['A_indexed']:,} | {med['I_immediate']:,} | "
                f"{med['B_search_index_false']:,} | {med['catch_up']:,} | "
                f"{entry['A_plus_catch_up_messages_per_s']:,} | "
                f"{entry['ratio_A_over_B']:.2f}{mark} | {entry['ratio_I_over_B']:.2f} |"
            )
    lines += ["", "Load average (1 min) by phase:", ""]
    for phase, stats in loads["by_phase"].items():
        lines.append(f"- {phase}: min {stats['min']}, mean {stats['mean']}, max {stats['max']}")
    return "\n".join(lines) + "\n"


def _shape_text(load: dict[str, Any]) -> str:
    shape, total = load["shape"], max(load["messages"], 1)
    roles = ", ".join(
        f"{role} {shape.get(f'role_{role}', 0) / total:.0%}"
        for role in ("user", "assistant", "tool", "system")
    )
    calls = shape.get("assistant_with_tool_calls", 0) / max(shape.get("role_assistant", 0), 1)
    return (
        f"{roles}; 1 in {1 / calls:.1f} assistant messages calls tools; "
        f"100 KB tool outputs: {shape.get('content_100kb', 0):,}; "
        f"{shape.get('content_non_ascii', 0) / total:.0%} with non-ASCII text"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.search_bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10,000 messages, few runs")
    parser.add_argument("--messages", type=int, help="messages to load (default 1,000,000)")
    parser.add_argument("--runs", type=int, help="timed runs per query and order (default 20)")
    parser.add_argument("--rounds", type=int, help="A/B rounds per batch size (default 3)")
    parser.add_argument(
        "--append-messages", type=int, help="messages per round, batches of 100 (default 20,000)"
    )
    parser.add_argument(
        "--time-cap",
        type=float,
        default=30.0,
        help="seconds per query and order after which runs stop (at least 5 are made)",
    )
    parser.add_argument(
        "--backend", choices=("sqlite", "postgresql", "both"), default="both", help="default both"
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("SESSIONREPO_TEST_POSTGRES_URL", DEFAULT_POSTGRES),
        help="server to make the benchmark database on",
    )
    parser.add_argument("--output", type=Path, default=RESULTS_DIR, help="results directory")
    args = parser.parse_args(argv)
    defaults = (10_000, 3, 1, 400) if args.quick else (1_000_000, 20, 3, 20_000)
    args.messages = args.messages or defaults[0]
    args.runs = args.runs or defaults[1]
    args.rounds = args.rounds or defaults[2]
    args.append_messages = args.append_messages or defaults[3]

    use_postgres = args.backend in ("postgresql", "both")
    use_sqlite = args.backend in ("sqlite", "both")
    started = time.perf_counter()
    machine = _machine(args.postgres_url if use_postgres else None)
    _log(f"generating the corpus for {args.messages:,} messages")
    corpus = Corpus(args.messages)
    backends: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack, LoadSampler() as sampler:
        stores: list[Store] = []
        if use_sqlite:
            stores.append(stack.enter_context(_sqlite_store()))
        if use_postgres:
            stores.append(stack.enter_context(_postgres_store(args.postgres_url)))
        sampler.phase = "load + reindex (" + " and ".join(s.backend for s in stores) + ")"
        began = time.perf_counter()
        loads = _load_all(stores, corpus)
        load_wall = time.perf_counter() - began
        for store, load in zip(stores, loads, strict=True):
            load["parallel_with"] = [s.backend for s in stores if s is not store]
            backends.append(_measure_backend(store, load, corpus, args, sampler))
    result = {
        "benchmark": "search",
        "quick": args.quick,
        "settings": {
            "messages": args.messages,
            "runs": args.runs,
            "rounds": args.rounds,
            "append_messages": args.append_messages,
            "time_cap_s": args.time_cap,
            "seed": SEED,
            "goal_p50_ms": GOAL_P50_MS,
            "goal_append_ratio": GOAL_APPEND_RATIO,
        },
        "machine": machine,
        "load_average": sampler.summary(),
        "backends": backends,
        "load_wall_s": round(load_wall, 1),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    args.output.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    base = args.output / f"search-{'quick-' if args.quick else ''}{stamp}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    markdown = _markdown(result)
    base.with_suffix(".md").write_text(markdown)
    print(markdown)
    _log(f"wrote {base}.json and .md in {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
