"""What a Citus coordinator sends its workers, as it says so itself
(``citus.log_remote_commands``): the check that a call contacts one worker and commits
in one phase (EXPLAIN's task counts show neither the intermediate results a statement
broadcasts nor a two-phase commit)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, event


class RemoteCommands:
    """What the coordinator sends to the workers, as it says so itself: every engine made
    while this is active sets ``citus.log_remote_commands`` on its connections, whose
    notices (``issuing <command>``, detail ``on server user@host:port ...``) are kept.

    EXPLAIN's task counts show neither the intermediate results a statement broadcasts
    nor a two-phase commit; the commands the workers receive show both."""

    def __init__(self) -> None:
        #: (worker host:port, the coordinator's id of the connection it went on, command):
        #: one connection, one transaction on that worker.
        self.sent: list[tuple[str, int, str]] = []
        self.recording = False

    def __enter__(self) -> RemoteCommands:
        event.listen(Engine, "connect", self._connected)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(Engine, "connect", self._connected)

    def _connected(self, dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.add_notice_handler(self._notice)
        cursor = dbapi_connection.cursor()
        cursor.execute("SET citus.log_remote_commands = on")
        cursor.close()
        dbapi_connection.commit()

    def _notice(self, diagnostic: Any) -> None:
        message = diagnostic.message_primary or ""
        found = re.search(
            r"on server \S+@(\S+:\d+) connectionId: (\d+)", diagnostic.message_detail or ""
        )
        if self.recording and message.startswith("issuing ") and found:
            worker, connection = found.group(1), int(found.group(2))
            self.sent.append((worker, connection, message.removeprefix("issuing ")))

    def during(self, action: Callable[[], object]) -> list[tuple[str, str]]:
        return [(worker, command) for worker, _, command in self.during_on(action)]

    def during_on(self, action: Callable[[], object]) -> list[tuple[str, int, str]]:
        """``(worker, connection id, command)`` of each command sent during ``action``."""
        start = len(self.sent)
        self.recording = True
        try:
            action()
        finally:
            self.recording = False
        return self.sent[start:]


def assert_one_worker(name: str, commands: list[tuple[str, str]]) -> str:
    """The commands went to one worker, and no transaction was committed in two phases;
    returns that worker."""
    workers = {worker for worker, _ in commands}
    assert len(workers) == 1, f"{name} contacts workers {sorted(workers)}: {commands}"
    two_phase = [c for _, c in commands if re.match(r"(PREPARE TRANSACTION|COMMIT PREPARED)", c)]
    assert not two_phase, f"{name} commits in two phases: {two_phase}"
    return workers.pop()
