"""Where one 1-message append's microseconds go, per backend: ``python -m bench.profile --budget``.

Four passes over the same kind of calls (one ``Message`` per call, round 200 sessions, a
fresh database), each a mean per call (means add up; a round trip's "each" is a median):

1. **total**: the calls alone, nothing traced or profiled.
2. **validation / encoding**: ``Message.from_openai(d)`` (what the dict path adds), and
   ``repository.prepare`` of a ``Message`` (checks and row encoding, before any SQL).
3. **the driver's view**: every statement the driver sends. PostgreSQL: libpq's own protocol
   trace on each pooled connection (``PGconn.trace``), so nothing is missed: psycopg's
   implicit ``BEGIN``, pipelined statements, prepared ones; a *round trip* is each wait
   for the server (messages sent, then its answers up to ``ReadyForQuery``), timed from
   the last message sent to the last answer. SQLite: ``sqlite3``'s trace callback names
   every statement it runs (the implicit ``BEGIN`` included), and the time inside the
   ``sqlite3`` C calls (statements, the commit's fsync) comes from the profile of pass 4.
4. **Python**: ``cProfile``; what is left of the total once encoding and the driver's
   waits are taken out is split by where the Python runs (sessionrepo, SQLAlchemy, the
   driver's Python, other).

The same trace is run over the raw yardsticks (``executemany`` + commit, and one
autocommit statement), so that their statements and round trips are counted the same way.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import re
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from typing import Any

from bench.databases import Databases, Target
from bench.workload import Transcripts


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6 if samples else 0.0


def _mean_us(samples: list[float]) -> float:
    """Means, not medians, for the parts of the budget: means add up."""
    return statistics.fmean(samples) * 1e6 if samples else 0.0


def _per_call(calls: list[Any], work: Callable[[Any], Any]) -> list[float]:
    times = []
    for call in calls:
        start = time.perf_counter()
        work(call)
        times.append(time.perf_counter() - start)
    return times


# -- libpq's protocol trace -----------------------------------------------------------


class _PgTrace:
    """libpq's trace of every psycopg connection given to :meth:`attach`."""

    def __init__(self) -> None:
        self._files: list[tuple[Any, str]] = []
        self._seen: set[int] = set()

    def attach(self, connection: Any) -> None:
        if id(connection) in self._seen:
            return
        self._seen.add(id(connection))
        handle, path = tempfile.mkstemp(prefix="bench-pqtrace-")
        connection.pgconn.trace(handle)
        self._files.append((connection, path))

    def stop(self) -> list[tuple[list[str], dict[str, str]]]:
        """Each connection's trace lines, and the statements it had prepared (by name)."""
        traces = []
        for connection, path in self._files:
            connection.pgconn.untrace()
            with open(path) as trace:
                lines = trace.read().splitlines()
            os.remove(path)
            names = {}
            with connection.cursor() as cursor:
                for name, statement in cursor.execute(
                    "SELECT name, statement FROM pg_prepared_statements"
                ).fetchall():
                    names[name] = statement
            connection.rollback()
            traces.append((lines, names))
        self._files.clear()
        return traces


#: A wait whose messages name no statement (a lone Sync, or text the trace's quoting split).
_UNNAMED = "(no statement named in the trace)"
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def round_trips(lines: list[str], names: dict[str, str] | None = None) -> list[tuple[str, float]]:
    """``(label, seconds)`` for each wait for the server in one connection's trace;
    ``names``: the text of statements prepared before the trace began."""
    names = dict(names or {})
    trips: list[tuple[str, float]] = []
    label, last_sent, last_answer = "", None, None
    labels: list[str] = []
    sending = True
    for line in lines:
        parts = line.split("\t")
        if len(parts) < 4:
            continue
        stamp = datetime.fromisoformat(parts[0]).timestamp()
        direction, kind = parts[1], parts[3]
        rest = parts[4].strip() if len(parts) > 4 else ""
        if direction == "F":
            if not sending:  # a new round trip starts: close the previous one
                trips.append(
                    (" + ".join(labels) or _UNNAMED, (last_answer or 0) - (last_sent or 0))
                )
                labels = []
            sending = True
            last_sent = stamp
            text = None
            quoted = _QUOTED.findall(rest)
            if kind == "Query" and quoted:
                text = quoted[0]
            elif kind == "Parse" and len(quoted) >= 2:
                names[quoted[0]] = text = quoted[1]
            elif kind == "Bind" and len(quoted) >= 2 and quoted[1]:
                text = names.get(quoted[1], f"prepared {quoted[1]}")
            if text is not None:
                label = _kind(text)
                if not labels or labels[-1] != label or kind == "Query":
                    labels.append(label)
        else:
            sending = False
            last_answer = stamp
    if not sending:
        trips.append((" + ".join(labels) or _UNNAMED, (last_answer or 0) - (last_sent or 0)))
    return trips


def _kind(statement: str) -> str:
    words = " ".join(statement.replace("\\n", " ").split())
    for marker in ("search_backlog", "messages_fts", "message_search"):
        if marker in words:
            return f"{' '.join(words.split()[:2])} … {marker}"
    if words.upper().startswith("WITH"):
        return "WITH … (one CTE statement)"
    return " ".join(words.split()[:4])[:48]


# -- sessionrepo ----------------------------------------------------------------------


_AREAS = (
    ("sessionrepo (repo/, models/)", ("/repo/", "/models/", "/sessionrepo/")),
    ("pydantic", ("/pydantic",)),
    ("SQLAlchemy", ("/sqlalchemy/",)),
    ("driver's Python (psycopg, sqlite3 module)", ("/psycopg/", "/sqlite3/")),
)
_DRIVER_C = (
    "sqlite3.",
    "'execute' of 'sqlite3",
    "'executemany' of 'sqlite3",
    "'commit' of 'sqlite3",
    "psycopg_binary",
    "'poll'",
    "'recv",
    "'send",
    "select.",
)


def _python_area(filename: str) -> str:
    for area, markers in _AREAS:
        if any(marker in filename for marker in markers):
            return area
    return "other Python (stdlib, uuid, json, datetime, …)"


def _profile_split(stats: pstats.Stats) -> tuple[dict[str, float], float]:
    """Seconds of Python by area (built-ins counted for their caller's area), and the
    seconds inside the driver's C calls."""
    areas: dict[str, float] = defaultdict(float)
    driver_c = 0.0
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _, name), (_, _, tottime, _, callers) in raw.items():
        if (filename.endswith("/psycopg/connection.py") and name == "wait") or (
            "/psycopg/waiting.py" in filename
        ):
            # psycopg blocks on the socket in Cython called from here (invisible to
            # cProfile): the server's time, which the trace measures.
            driver_c += tottime
            continue
        if filename == "~":
            if any(marker in name for marker in _DRIVER_C):
                driver_c += tottime
                continue
            total = sum(edge[3] for edge in callers.values()) or 1.0
            for (caller_file, _, _), edge in callers.items():
                areas[_python_area(caller_file)] += tottime * edge[3] / total
            if not callers:
                areas[_python_area("")] += tottime
            continue
        areas[_python_area(filename)] += tottime
    return dict(areas), driver_c


def _sqlite_statements(engine: Any) -> tuple[list[str], Callable[[], None]]:
    """Every statement sqlite3 runs on the engine's connections (from now on)."""
    from sqlalchemy import event

    statements: list[str] = []
    traced: set[int] = set()

    def attach(dbapi_connection: Any, *_: Any) -> None:
        if id(dbapi_connection) not in traced:
            traced.add(id(dbapi_connection))
            dbapi_connection.set_trace_callback(lambda sql: statements.append(_kind(sql)))

    event.listen(engine.pool, "checkout", attach)

    def stop() -> None:
        event.remove(engine.pool, "checkout", attach)

    return statements, stop


def budget(backend: str, target: Target, raw_targets: list[Target], calls_count: int) -> str:
    from sqlalchemy import event

    from sessionrepo import Message, open_repository

    transcripts = Transcripts(20261129)
    repo = open_repository(target.location, auto_migrate=True)
    sessions = [f"p{index:04d}" for index in range(200)]
    for session_id in sessions:
        repo.create_session(session_id, source="bench")

    def make(count: int) -> list[tuple[str, list[Any]]]:
        return [
            (sessions[index % len(sessions)], transcripts.take(sessions[index % len(sessions)], 1))
            for index in range(count)
        ]

    def append(call: tuple[str, list[Any]]) -> None:
        repo.append(call[0], call[1])

    def as_messages(calls: list[tuple[str, list[Any]]]) -> list[tuple[str, list[Any]]]:
        return [(sid, [Message.from_openai(d) for d in dicts]) for sid, dicts in calls]

    _per_call(as_messages(make(50)), append)  # warm-up: caches, prepared statements
    # 1. total, Message objects and dicts
    total = _mean_us(_per_call(as_messages(make(calls_count)), append))
    dicts_total = _mean_us(_per_call(make(calls_count), append))
    # 2. validation, encoding
    sample = make(calls_count)
    validation = _mean_us(_per_call(sample, lambda c: Message.from_openai(c[1][0])))
    prepared = as_messages(make(calls_count))
    encoding = (
        _mean_us(_per_call(prepared, lambda c: repo.prepare(c[0], c[1])))
        if hasattr(repo, "prepare")
        else 0.0
    )
    # 3. the driver's view
    engine = repo.database.engine
    traced = as_messages(make(calls_count))
    lines: list[str] = []
    if backend == "postgresql":
        trace = _PgTrace()

        def on_checkout(dbapi_connection: Any, *_: Any) -> None:
            trace.attach(dbapi_connection)

        event.listen(engine.pool, "checkout", on_checkout)
        _per_call(traced, append)
        event.remove(engine.pool, "checkout", on_checkout)
        trips = [trip for lines_, names in trace.stop() for trip in round_trips(lines_, names)]
        by_label: dict[str, list[float]] = defaultdict(list)
        for label, seconds in trips:
            by_label[label].append(seconds)
        wait = sum(seconds for _, seconds in trips) / len(traced) * 1e6
        lines.append(
            f"  round trips to the server: {len(trips) / len(traced):.1f} per call "
            "(libpq's trace: each wait for an answer)"
        )
        for label, samples in sorted(by_label.items(), key=lambda item: -sum(item[1])):
            lines.append(
                f"    {label:<58} {len(samples) / len(traced):4.1f}×  "
                f"{_median_us(samples):6.0f} µs each  "
                f"{sum(samples) / len(traced) * 1e6:6.0f} µs/call"
            )
    else:
        statements, stop = _sqlite_statements(engine)
        _per_call(traced, append)
        stop()
        counts: dict[str, int] = defaultdict(int)
        for statement in statements:
            counts[statement] += 1
        lines.append(
            f"  statements sqlite3 ran: {len(statements) / len(traced):.1f} per call "
            "(its trace callback: the implicit BEGIN included)"
        )
        for label, count in sorted(counts.items(), key=lambda item: -item[1]):
            lines.append(f"    {label:<58} {count / len(traced):4.1f}×")
        wait = 0.0
    # 4. Python
    profiled = as_messages(make(calls_count))
    profiler = cProfile.Profile()
    profiler.enable()
    _per_call(profiled, append)
    profiler.disable()
    areas, driver_c = _profile_split(pstats.Stats(profiler))
    repo.close()
    if backend == "sqlite":
        profiled_total = sum(areas.values()) + driver_c
        wait = total * driver_c / profiled_total if profiled_total else 0.0
        lines.append(
            f"  inside sqlite3's C calls (statements, the commit's fsync): {wait:6.0f} µs/call "
            "(its share of the profiled time, applied to the total)"
        )
    python = max(0.0, total - encoding - wait)
    python_total = sum(areas.values()) or 1.0
    out = [
        f"### {'PostgreSQL' if backend == 'postgresql' else 'SQLite'}: one 1-message append "
        f"(means over {calls_count} calls, µs; 'each' is a median)",
        "",
        "```",
        f"  total per call, Message objects (nothing traced)          {total:6.0f}",
        f"  total per call, dicts (validation timed)                  {dicts_total:6.0f}",
        f"  validation: Message.from_openai(d), the dict path's extra {validation:6.0f}",
        f"  encoding and checks: repository.prepare(Message)         {encoding:6.0f}",
        *lines,
        f"  Python around the statements (the rest of the total)      {python:6.0f}",
    ]
    for area, seconds in sorted(areas.items(), key=lambda item: -item[1]):
        out.append(f"    {area:<56} {python * seconds / python_total:6.0f}")
    out += ["```", ""]
    out += _raw_yardsticks(backend, raw_targets)
    return "\n".join(out)


def _raw_yardsticks(backend: str, targets: list[Target]) -> list[str]:
    """The raw contenders' statements and round trips, traced the same way."""
    from bench.contenders._raw import Raw, RawAutocommit

    out = []
    transcripts = Transcripts(20261130)
    for cls, target in zip((Raw, RawAutocommit), targets, strict=True):
        contender = cls(target)
        contender.open()
        sessions = [f"{cls.key}-{index}" for index in range(20)]
        contender.create_sessions(sessions)
        calls = [(sessions[i % 20], transcripts.take(sessions[i % 20], 1)) for i in range(200)]
        contender.flush(calls[:50], float("inf"))
        timed = calls[50:]
        if backend == "postgresql":
            trace = _PgTrace()
            trace.attach(contender.connection)
            contender.flush(timed, float("inf"))
            trips = round_trips(*trace.stop()[0])
            labels: dict[str, list[float]] = defaultdict(list)
            for label, seconds in trips:
                labels[label].append(seconds)
            detail = ", ".join(
                f"{label} {_median_us(samples):.0f} µs" for label, samples in labels.items()
            )
            out.append(
                f"- {cls.label}: {len(trips) / len(timed):.1f} round trips per 1-message call "
                f"({detail})"
            )
        else:
            statements: list[str] = []

            def note(sql: str, statements: list[str] = statements) -> None:
                statements.append(_kind(sql))

            contender.connection.set_trace_callback(note)
            contender.flush(timed, float("inf"))
            contender.connection.set_trace_callback(None)
            counts: dict[str, int] = defaultdict(int)
            for statement in statements:
                counts[statement] += 1
            detail = ", ".join(
                f"{label} {count / len(timed):.0f}×" for label, count in counts.items()
            )
            out.append(
                f"- {cls.label}: {len(statements) / len(timed):.1f} statements per 1-message "
                f"call ({detail})"
            )
        contender.close()
    return [*out, ""]


def run(backend: str, postgres_url: str | None, calls: int) -> str:
    with Databases(postgres_url, f"bench_budget_{os.getpid()}") as databases:
        target = databases.create(backend, "budget")
        raw = [databases.create(backend, name) for name in ("budget_raw", "budget_raw_ac")]
        return budget(backend, target, raw, calls)
