"""Worker functions for the multi-process tests (``contract/test_concurrency.py``).

They run in child processes started with the ``spawn`` method, so they live in a module
the child can import by name: the child inherits the parent's ``sys.path`` (spawn passes
it along), which has ``tests/`` on it (see :mod:`support`).

A worker never raises: it reports everything it did, and every exception any call
raised (as text, with the traceback), in one dict on ``results``, so the parent can
assert on all of it. Keys travel as strings.
"""

from __future__ import annotations

import random
from typing import Any

from sessionrepo import SessionRepository, ensure_key, open_repository

from support.harness import error_text

#: How long a worker waits at the start barrier for the others.
BARRIER_TIMEOUT = 120.0


def _openai_message(worker: int, index: int) -> dict[str, Any]:
    """A gateway's message dict, stamped with its key once, when it is made."""
    if index % 5 == 4:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{worker}_{index}",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": f'{{"n": {index}}}'},
                }
            ],
        }
    else:
        role = "user" if index % 2 == 0 else "assistant"
        message = {"role": role, "content": f"worker {worker} message {index}"}
    ensure_key(message)
    return message


def _call_record(
    kind: str, batch: list[dict[str, Any]], fresh: list[dict[str, Any]], result: Any
) -> dict[str, Any]:
    return {
        "kind": kind,
        "sent": [m["client_msg_uuid"] for m in batch],
        "fresh": [m["client_msg_uuid"] for m in fresh],
        "inserted": [str(k) for k in result.inserted],
        "duplicates": [str(k) for k in result.duplicates],
        "conflicts": [str(k) for k in result.conflicts],
        "first_seq": result.first_seq,
    }


def flush_one_session(
    *,
    url: str,
    session_id: str,
    worker: int,
    count: int,
    seed: int,
    start: Any,
    results: Any,
) -> None:
    """Make ``count`` messages and flush them to one shared session like a gateway does.

    Small random batches; sometimes a batch goes out together with the whole history so
    far (a full-transcript flush), sometimes an earlier batch or the whole history is
    sent again on its own. Every ``append`` is recorded with what it sent and what it got.
    """
    report: dict[str, Any] = {"worker": worker, "made": [], "calls": [], "errors": []}
    rng = random.Random(seed)
    repository: SessionRepository | None = None
    try:
        repository = open_repository(url)
        start.wait(BARRIER_TIMEOUT)
        history: list[dict[str, Any]] = []
        batches: list[list[dict[str, Any]]] = []
        while len(history) < count:
            size = min(rng.randint(1, 4), count - len(history))
            fresh = [_openai_message(worker, len(history) + i) for i in range(size)]
            report["made"] += [m["client_msg_uuid"] for m in fresh]
            if rng.random() < 0.25 and history:
                batch = history + fresh
                report["calls"].append(
                    _call_record("history+new", batch, fresh, repository.append(session_id, batch))
                )
            else:
                report["calls"].append(
                    _call_record("new", fresh, fresh, repository.append(session_id, fresh))
                )
            history += fresh
            batches.append(fresh)
            roll = rng.random()
            if roll < 0.15:
                again = rng.choice(batches)
                report["calls"].append(
                    _call_record("resend-batch", again, [], repository.append(session_id, again))
                )
            elif roll < 0.22:
                again = list(history)
                report["calls"].append(
                    _call_record("resend-all", again, [], repository.append(session_id, again))
                )
    except BaseException as exc:
        report["errors"].append(error_text(f"worker {worker}", exc))
    finally:
        if repository is not None:
            repository.close()
        results.put(report)


def sqlite_writer(
    *,
    url: str,
    worker: int,
    rounds: int,
    shared_sessions: list[str],
    seed: int,
    start: Any,
    results: Any,
) -> None:
    """Many small batches to the worker's own session and to the shared ones, with a
    read now and then. Opens its repository only after the start barrier, so that
    opening (which checks the schema revision) races the other writers too.

    A failed call is recorded and the worker carries on, so that every failure shows.
    """
    own = f"own-{worker}"
    report: dict[str, Any] = {"worker": worker, "sent": {}, "errors": [], "reads": 0}
    rng = random.Random(seed)
    repository: SessionRepository | None = None
    try:
        start.wait(BARRIER_TIMEOUT)
        repository = open_repository(url)
        made = 0
        for round_ in range(rounds):
            for session_id in (own, shared_sessions[round_ % len(shared_sessions)]):
                batch = [_openai_message(worker, made + i) for i in range(rng.randint(1, 3))]
                made += len(batch)
                try:
                    repository.append(session_id, batch, source="test")
                except Exception as exc:
                    report["errors"].append(error_text(f"append to {session_id}", exc))
                    continue
                report["sent"].setdefault(session_id, []).extend(
                    m["client_msg_uuid"] for m in batch
                )
            if round_ % 5 == 4:
                try:
                    repository.load_transcript(own)
                    repository.list_sessions(limit=10)
                    report["reads"] += 2
                except Exception as exc:
                    report["errors"].append(error_text("read", exc))
    except BaseException as exc:
        report["errors"].append(error_text(f"writer {worker}", exc))
    finally:
        if repository is not None:
            repository.close()
        results.put(report)


def sqlite_reader(
    *,
    url: str,
    reader: int,
    shared_sessions: list[str],
    start: Any,
    stop: Any,
    results: Any,
) -> None:
    """Read transcripts and listings until ``stop`` is set, checking that every
    transcript read is gap-free (``seq`` 1..n: a reader never sees part of a batch)."""
    report: dict[str, Any] = {"reader": reader, "errors": [], "reads": 0, "gaps": []}
    repository: SessionRepository | None = None
    try:
        start.wait(BARRIER_TIMEOUT)
        repository = open_repository(url)
        turn = 0
        # At least a few rounds even if the writers are already done.
        while turn < 3 or not stop.is_set():
            session_id = shared_sessions[turn % len(shared_sessions)]
            turn += 1
            try:
                seqs = [m.seq for m in repository.load_transcript(session_id)]
                repository.list_sessions(limit=20)
                report["reads"] += 2
            except Exception as exc:
                report["errors"].append(error_text(f"read {session_id}", exc))
                continue
            if seqs != list(range(1, len(seqs) + 1)):
                report["gaps"].append((session_id, seqs))
    except BaseException as exc:
        report["errors"].append(error_text(f"reader {reader}", exc))
    finally:
        if repository is not None:
            repository.close()
        results.put(report)
