"""Fault injection and child-process workers for the outbox's tests (``tests/outbox/``).

The workers run in child processes (``spawn`` or ``forkserver``), so they live in a
module the child imports by name (``support.outbox_workers``: see :mod:`support`).

Acknowledgements travel through a ``multiprocessing`` pipe, never a queue: a queue hands
its items to a feeder thread, which a ``SIGKILL`` can stop before they are written,
while ``Connection.send`` has written the bytes to the pipe when it returns. A message
is acknowledged when ``write`` returned for it; the ack is sent right after.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from sessionrepo import (
    BackendUnavailable,
    SessionRepository,
    TranscriptWriter,
    WriteRejected,
    ensure_key,
    open_repository,
)
from sessionrepo.outbox.table import ClaimedBatch
from sessionrepo.store.repository import PreparedBatch

#: A PostgreSQL URL where nothing listens: connecting is refused at once.
CLOSED_PORT_URL = "postgresql://postgres@127.0.0.1:1/nowhere"
#: How long a worker waits at a barrier for the others.
BARRIER_TIMEOUT = 60.0


def make_message(session_id: str, index: int) -> dict[str, Any]:
    """A gateway's message dict, keyed once where it is made; its content names it."""
    if index % 5 == 4:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{session_id}_{index}",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": f'{{"n": {index}}}'},
                }
            ],
        }
    else:
        role = "user" if index % 2 == 0 else "assistant"
        message = {"role": role, "content": f"{session_id} message {index}"}
    ensure_key(message)
    return message


def closed_primary() -> SessionRepository:
    """A primary that is down: a PostgreSQL URL on a port where nothing listens."""
    return open_repository(CLOSED_PORT_URL, require_connection=False, connect_timeout=1)


class FlakyRepository(SessionRepository):
    """A real repository whose ``append_prepared`` fails on demand, before touching the
    database (the outbox, even when it lives in the same database, is unaffected).

    Attributes:
        down: every write fails as the primary being unavailable.
        fail_once: keys (as text) whose next write fails as unavailable, once each.
        reject: keys (as text) the primary refuses for their content, every time.
        hang: an event; while it is not set, writes block (a primary that does not
            answer).
    """

    def __init__(self, repository: SessionRepository) -> None:
        super().__init__(repository.database)
        self.down = False
        self.fail_once: set[str] = set()
        self.reject: set[str] = set()
        self.hang: threading.Event | None = None
        self.attempts: list[list[str]] = []
        self._lock = threading.Lock()

    @classmethod
    def open(cls, url: str) -> FlakyRepository:
        return cls(open_repository(url))

    def append_prepared(
        self, batch: PreparedBatch, *, timeout: float | None = None, **options: Any
    ) -> Any:
        keys = [str(message.client_msg_uuid) for message in batch.messages]
        with self._lock:
            self.attempts.append(keys)
            once = self.fail_once.intersection(keys)
            self.fail_once -= once
        if self.hang is not None:
            self.hang.wait()
        if self.down or once:
            raise BackendUnavailable("the primary is down (injected)", code="injected")
        rejected = self.reject.intersection(keys)
        if rejected:
            raise WriteRejected(f"rejected by the primary (injected): {sorted(rejected)}")
        return super().append_prepared(batch, timeout=timeout, **options)


def _quiet() -> None:
    """A child parks thousands of batches: one warning each would flood the test log."""
    logging.getLogger("sessionrepo").setLevel(logging.ERROR)


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_hook(step: str, occurrence: int) -> Callable[[str], None]:
    """A ``fault_hook`` that SIGKILLs this process at the ``occurrence``-th ``step``."""
    seen = 0

    def hook(name: str) -> None:
        nonlocal seen
        if name == step:
            seen += 1
            if seen == occurrence:
                _kill_self()

    return hook


def kill_point_writer(
    *,
    url: str,
    outbox_url: str,
    step: str,
    kill_at: int,
    batches: list[tuple[str, list[dict[str, Any]]]],
    conn: Any,
) -> None:
    """Write ``batches`` one by one, acknowledging each through ``conn``, and die by
    SIGKILL at the ``kill_at``-th passage through ``step``.

    Steps reached only when the primary fails (``after_primary_failure``,
    ``after_park``) get a primary that is down. ``drain_after_primary_commit``: every
    batch is parked first (acknowledged), then the primary comes back and this process
    drains, dying between a primary commit and the outbox delete.
    """
    _quiet()
    primary = FlakyRepository.open(url)
    primary.down = step in ("after_primary_failure", "after_park", "drain_after_primary_commit")
    draining = step == "drain_after_primary_commit"
    # A short lease when this process will die holding claims (its heartbeat renews
    # them while it lives): the parent's recovery waits for it to end.
    deadline = 1.0 if draining else 10.0
    writer = TranscriptWriter(primary, outbox_url=outbox_url, deadline=deadline, lease=2.0)
    if not draining:
        writer.fault_hook = kill_hook(step, kill_at)
    for session_id, messages in batches:
        result = writer.write(session_id, messages)
        conn.send(("ack", result.status, [m["client_msg_uuid"] for m in messages]))
    if draining:
        primary.down = False
        writer.fault_hook = kill_hook(step, kill_at)
        writer.drain()
    conn.send(("survived", step, None))


def park_until_killed(
    *, outbox_url: str, seed: int, first_index: int, ready: Any, conn: Any
) -> None:
    """Park messages (the primary is down) as fast as possible until killed; send each
    batch's keys through ``conn`` before ``write`` and again once it has returned."""
    _quiet()
    rng = random.Random(seed)
    writer = TranscriptWriter(closed_primary(), outbox_url=outbox_url, deadline=10.0)
    ready.set()
    index = first_index
    while True:
        session_id = f"durable-{rng.randrange(4)}"
        batch = [make_message(session_id, index + n) for n in range(rng.randint(1, 3))]
        index += len(batch)
        keys = [m["client_msg_uuid"] for m in batch]
        conn.send(("trying", keys))
        result = writer.write(session_id, batch)
        conn.send((result.status, keys))


def _recording_claims(writer: TranscriptWriter, claims: list[list[Any]]) -> None:
    """Record every batch the writer's drain claims: (session, position, key)."""
    outbox = writer.outbox
    claim = outbox.claim

    def recorded(*args: Any, **kwargs: Any) -> ClaimedBatch | None:
        batch = claim(*args, **kwargs)
        if batch is not None:
            claims.append(
                [
                    [batch.session_id, position, str(message.client_msg_uuid)]
                    for position, message in zip(batch.positions, batch.messages, strict=True)
                ]
            )
        return batch

    outbox.claim = recorded  # type: ignore[method-assign]


def drain_outbox(
    *,
    drainer: int,
    url: str,
    outbox_url: str | None,
    batch_size: int,
    start: Any,
    results: Any,
) -> None:
    """Drain the shared outbox once, released with the others by ``start``; report the
    drain's figures, every claimed batch, and every exception."""
    report: dict[str, Any] = {"drainer": drainer, "claims": [], "errors": [], "drain": None}
    try:
        repository = open_repository(url)
        writer = TranscriptWriter(repository, outbox_url=outbox_url, batch_size=batch_size)
        _recording_claims(writer, report["claims"])
        start.wait(BARRIER_TIMEOUT)
        report["drain"] = writer.drain().model_dump()
        writer.close()
        repository.close()
    except BaseException as exc:
        report["errors"].append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    results.put(report)


def keys_of(messages: Iterable[dict[str, Any]]) -> list[str]:
    return [str(message["client_msg_uuid"]) for message in messages]


def park_batch(*, outbox_url: str, session_id: str, batch: list[dict[str, Any]]) -> None:
    """Another gateway, its primary down: park ``batch`` in the shared outbox, then exit."""
    _quiet()
    writer = TranscriptWriter(closed_primary(), outbox_url=outbox_url, deadline=5.0)
    try:
        result = writer.write(session_id, batch)
        assert result.status == "parked", result
    finally:
        writer.close()


class _HangingPrimary(SessionRepository):
    """A primary whose appends say so through ``conn`` and then never return: a drainer
    stuck in a replay, holding its claim, until it is killed."""

    def __init__(self, repository: SessionRepository, conn: Any) -> None:
        super().__init__(repository.database)
        self._conn = conn

    def append_prepared(
        self, batch: PreparedBatch, *, timeout: float | None = None, **options: Any
    ) -> Any:
        self._conn.send(("replaying", batch.session_id))
        threading.Event().wait()  # until SIGKILL


def drain_until_killed(*, url: str, outbox_url: str, lease: float, conn: Any) -> None:
    """Drain the shared outbox through a primary that never answers, with a deadline far
    beyond the test, so that this process holds its claim (``lease``, renewed) until it
    is killed. Sends the claim's owner, then word once the replay has begun."""
    _quiet()
    primary = _HangingPrimary(open_repository(url), conn)
    writer = TranscriptWriter(primary, outbox_url=outbox_url, deadline=600.0, lease=lease)
    conn.send(("owner", writer._owner))
    writer.drain()
    conn.send(("survived", None))
