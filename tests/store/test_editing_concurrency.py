"""Two gateway processes appending to and rewinding one session at once: the transcript,
and what every call reported, are those of one serial order of their calls."""

from __future__ import annotations

from typing import Any

from sessionrepo import open_repository

from support import editing_workers as workers
from support.harness import SPAWN, children, collect_reports

CALLS = 60


def _serial_order(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls in the one order their results allow: appends by the seq they got; a
    rewind right after the newest message it took out (one that took nothing out, right
    after the message at its seq, where nothing after it was stored yet)."""
    seq_of = {call["key"]: call["seq"] for call in calls if call["op"] == "append"}

    def position(call: dict[str, Any]) -> tuple[float, int]:
        if call["op"] == "append":
            return (call["seq"], 0)
        if call["superseded"]:
            return (max(seq_of[key] for key in call["superseded"]) + 0.5, 0)
        return (call["to_seq"] + 0.5, 1)

    return sorted(calls, key=position)


def test_concurrent_rewinds_and_appends_equal_a_serial_order(database_url: str) -> None:
    setup = open_repository(database_url, auto_migrate=True)
    setup.create_session(workers.SESSION, source="test")
    setup.close()
    barrier = SPAWN.Barrier(2)
    results = SPAWN.Queue()
    with children() as processes:
        for index, name in enumerate(("gateway-a", "gateway-b")):
            process = SPAWN.Process(
                target=workers.gateway,
                args=((database_url, name, index + 7, CALLS), barrier, results),
            )
            process.start()
            processes.append(process)
        reports = collect_reports(results, 2, processes)
    calls = [call for report in reports for call in report["log"]]
    assert len(calls) == 2 * CALLS
    assert sum(call["op"] == "rewind" for call in calls) > 5

    # Replay the calls one at a time in that order: each must report what it did there.
    live: dict[int, str] = {}
    next_seq = 1
    for call in _serial_order(calls):
        if call["op"] == "append":
            assert call["seq"] == next_seq
            live[call["seq"]] = call["key"]
            next_seq += 1
        else:
            taken = [key for seq, key in sorted(live.items()) if seq > call["to_seq"]]
            assert call["superseded"] == taken
            for seq in [seq for seq in live if seq > call["to_seq"]]:
                del live[seq]

    repository = open_repository(database_url)
    try:
        stored = repository.load_transcript(workers.SESSION, include_retracted=True)
        assert [m.seq for m in stored] == list(range(1, next_seq))  # gap-free
        transcript = repository.load_transcript(workers.SESSION)
        assert [str(m.client_msg_uuid) for m in transcript] == [live[s] for s in sorted(live)]
        assert repository.get_session(workers.SESSION).message_count == len(live)
    finally:
        repository.close()
