"""Worker functions for the outage tests (``outbox/test_outages.py``), run in spawned processes.

Each worker is one gateway process: its own repository on the (throwaway) primary, its
own ``TranscriptWriter`` with a private SQLite outbox file, a background drainer, and the
sessions it owns. A worker never raises: everything it did, and every exception any call
raised (as text, with the traceback), goes back in one dict on ``results``. Keys travel
as strings.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from sessionrepo import (
    BackendUnavailable,
    SessionRepository,
    TranscriptWriter,
    ensure_key,
    open_repository,
)

from support.harness import error_text

#: How long a worker waits at the start barrier, or for the restart, at most.
WAIT_TIMEOUT = 120.0
#: Times a write that neither store could take is sent again before the worker gives up.
MAX_SENDS = 200


def outage_message(worker: int, session_id: str, index: int) -> dict[str, Any]:
    """A gateway's message dict, keyed once where it is made. The content is unique to
    the message, so a message stored twice under two keys would show as a duplicate."""
    content = f"{session_id} message {index} from writer {worker}"
    if index % 7 == 6:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{worker}_{index}",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": f'{{"q": "{content}"}}'},
                }
            ],
        }
    else:
        message = {"role": "user" if index % 2 == 0 else "assistant", "content": content}
    ensure_key(message)
    return message


def message_identity(role: str, content: Any, tool_calls: Any) -> str:
    """What makes a message itself, whatever its key: the text or the tool call."""
    if content is not None:
        return str(content)
    return str(tool_calls[0]["function"]["arguments"])


def crash_writer(
    *,
    url: str,
    outbox_path: str,
    worker: int,
    sessions: list[str],
    count: int,
    resend_rate: float,
    deadline: float,
    background_drainer: bool,
    seed: int,
    start: Any,
    stopped: Any,
    restarted: Any,
    results: Any,
) -> None:
    """Write ``count`` new messages to this worker's ``sessions`` through a
    ``TranscriptWriter``, in random batches of 1-4, re-sending an earlier acknowledged
    batch on ``resend_rate`` of the calls, and carrying on whatever the primary does.
    With ``background_drainer`` the writer replays its outbox while it writes, as a
    gateway would; without, everything parked stays for the drain after the run.

    Half of the messages wait for ``stopped`` and the last tenth for ``restarted``, so
    that some writes surely meet the outage and some happen after the primary is back.
    A write that raises (neither store took it) is sent again, as a gateway holding the
    messages would; a batch counts as acknowledged only once ``write`` returned.
    """
    report: dict[str, Any] = {
        "worker": worker,
        "order": {sid: [] for sid in sessions},  # keys in the order first sent
        "identity": {},  # key -> content identity
        "acknowledged": [],
        "calls": 0,
        "stored": 0,
        "parked": 0,
        "raised": 0,
        "resends": 0,
        "resend_inserted": 0,
        "slowest": 0.0,
        "raised_errors": [],  # writes neither store took (sent again)
        "errors": [],
    }
    rng = random.Random(seed)
    repository: SessionRepository | None = None
    writer: TranscriptWriter | None = None
    # Each parked batch logs a warning; the report counts them instead.
    logging.getLogger("sessionrepo").setLevel(logging.ERROR)

    def send(session_id: str, batch: list[dict[str, Any]], *, resend: bool) -> bool:
        for _ in range(MAX_SENDS):
            report["calls"] += 1
            began = time.monotonic()
            try:
                assert writer is not None
                result = writer.write(session_id, batch)
            except BackendUnavailable as exc:
                report["raised"] += 1
                report["raised_errors"].append(error_text(f"write to {session_id}", exc))
                continue
            finally:
                report["slowest"] = max(report["slowest"], time.monotonic() - began)
            report[result.status] += 1
            if resend:
                report["resend_inserted"] += len(result.inserted)
            return True
        return False

    try:
        repository = open_repository(url, require_connection=False, connect_timeout=2)
        writer = TranscriptWriter(
            repository,
            outbox_url=f"sqlite:///{outbox_path}",
            deadline=deadline,
            backoff_base=0.05,
            backoff_cap=1.0,
        )
        if background_drainer:
            writer.start(interval=0.2)
        made = dict.fromkeys(sessions, 0)
        acknowledged: list[tuple[str, list[dict[str, Any]]]] = []
        start.wait(WAIT_TIMEOUT)
        total = 0
        while total < count:
            if total >= count // 2 and not stopped.is_set():
                stopped.wait(WAIT_TIMEOUT)
            if total >= count * 9 // 10 and not restarted.is_set():
                restarted.wait(WAIT_TIMEOUT)
            if acknowledged and rng.random() < resend_rate:
                session_id, batch = rng.choice(acknowledged)
                report["resends"] += 1
                if not send(session_id, batch, resend=True):
                    raise RuntimeError(f"a re-send to {session_id} was never acknowledged")
                continue
            session_id = rng.choice(sessions)
            size = min(rng.randint(1, 4), count - total)
            batch = [outage_message(worker, session_id, made[session_id] + i) for i in range(size)]
            made[session_id] += size
            total += size
            for message in batch:
                key = message["client_msg_uuid"]
                report["order"][session_id].append(key)
                report["identity"][key] = message_identity(
                    message["role"], message["content"], message.get("tool_calls")
                )
            if not send(session_id, batch, resend=False):
                raise RuntimeError(f"a batch for {session_id} was never acknowledged")
            acknowledged.append((session_id, batch))
            report["acknowledged"] += [m["client_msg_uuid"] for m in batch]
    except BaseException as exc:
        report["errors"].append(error_text(f"writer {worker}", exc))
    finally:
        if writer is not None:
            try:
                writer.close()
            except BaseException as exc:
                report["errors"].append(error_text(f"writer {worker} close", exc))
        if repository is not None:
            repository.close()
        results.put(report)


def write_while_frozen_then_exit(
    *, url: str, outbox_path: str, deadline: float, ready: Any, frozen: Any, results: Any
) -> None:
    """A gateway that stores one message, writes another while the primary is frozen
    (``frozen`` is set by the parent once it froze it), closes its writer and exits."""
    report: dict[str, Any] = {"statuses": [], "errors": [], "closed": False}
    try:
        logging.getLogger("sessionrepo").setLevel(logging.ERROR)
        with (
            open_repository(url, require_connection=False, connect_timeout=2) as repository,
            TranscriptWriter(
                repository, outbox_url=f"sqlite:///{outbox_path}", deadline=deadline
            ) as writer,
        ):
            first = {"role": "user", "content": "before the freeze"}
            ensure_key(first)
            report["statuses"].append(writer.write("exit", [first]).status)
            ready.set()
            frozen.wait(WAIT_TIMEOUT)
            second = {"role": "user", "content": "while frozen"}
            ensure_key(second)
            report["statuses"].append(writer.write("exit", [second]).status)
        report["closed"] = True
    except BaseException as exc:
        report["errors"].append(error_text("gateway", exc))
    finally:
        ready.set()
        results.put(report)
