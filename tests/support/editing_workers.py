"""Child processes for tests/store/test_editing_concurrency.py: a gateway that appends to and
rewinds one session, recording what each call reported."""

from __future__ import annotations

import random
from typing import Any

from sessionrepo import Message, open_repository

SESSION = "shared"


def gateway(job: tuple[str, str, int, int], barrier: Any, results: Any) -> None:
    """Append or rewind ``calls`` times after the barrier; report every call's outcome."""
    url, name, seed, calls = job
    chance = random.Random(seed)
    repository = open_repository(url)
    log: list[dict[str, Any]] = []
    last_seq = 0
    try:
        barrier.wait(timeout=60)
        for index in range(calls):
            if chance.random() < 0.7:
                message = Message(role="user", content=f"{name} {index}")
                result = repository.append(SESSION, [message])
                assert result.first_seq is not None
                last_seq = result.first_seq
                log.append({"op": "append", "key": str(message.client_msg_uuid), "seq": last_seq})
            else:
                to_seq = max(0, last_seq - chance.randrange(4))
                edit = repository.rewind(SESSION, to_seq)
                log.append(
                    {
                        "op": "rewind",
                        "to_seq": to_seq,
                        "superseded": [str(k) for k in edit.superseded],
                    }
                )
    finally:
        repository.close()
        results.put({"name": name, "log": log})
