"""What ``sessionrepo demo`` does: real gateway processes flush overlapping transcripts
into one embedded SQLite file, the way an agent gateway does, live through an outage of
that file, recover, and the file is then checked with plain SQL for anything lost or
doubled.

Three gateway processes (``discord``, ``telegram``, ``cli``) start together behind a
barrier and write at the same time:

- every message is an OpenAI-format dict stamped once, when it is made, with
  :func:`sessionrepo.models.ensure_key`;
- after every turn a gateway re-flushes its *whole* in-memory transcript, and also
  flushes mid-turn when the user interrupts, and once more at shutdown and at close;
- ``discord`` and ``telegram`` both write into one shared group-chat session;
- ``discord`` hands a direct-message session over to ``cli``, which loads it back
  from the store (``to_openai(include_key=True)``), re-flushes it, and continues it
  while ``discord`` still re-flushes its stale copy at shutdown;
- every gateway writes through a :class:`~sessionrepo.TranscriptWriter` with its own
  local outbox file beside the primary. Half-way, a fourth process takes the primary's
  write lock (``BEGIN EXCLUSIVE`` on a plain ``sqlite3`` connection): the gateways
  flush only once it holds the lock, for one whole turn each, so every write of that
  turn is parked in the outbox (the busy timeout is short and the deadline one second).
  When every gateway is through that turn the lock is released and each gateway drains
  its outbox, then carries on; at shutdown it drains again and reports what is left.

No process keeps any "already written" bookkeeping: the key alone makes every re-send a
no-op. :func:`run_demo` returns a :class:`DemoResult`; the command line only prints it.
"""

from sessionrepo.demo.gateway import (
    BUSY_TIMEOUT,
    CLI,
    DEADLINE,
    DIRECT,
    DRAIN_ROUNDS,
    EXIT_PATHS,
    GATEWAYS,
    GROUP,
    TELEGRAM,
    WAIT_SECONDS,
)
from sessionrepo.demo.report import Check, DemoResult, GatewayReport, OutageReport
from sessionrepo.demo.run import outbox_paths, run_demo

__all__ = [
    "BUSY_TIMEOUT",
    "CLI",
    "DEADLINE",
    "DIRECT",
    "DRAIN_ROUNDS",
    "EXIT_PATHS",
    "GATEWAYS",
    "GROUP",
    "TELEGRAM",
    "WAIT_SECONDS",
    "Check",
    "DemoResult",
    "GatewayReport",
    "OutageReport",
    "outbox_paths",
    "run_demo",
]
