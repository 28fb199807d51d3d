"""``python -m bench.frozen``: write latency while the primary is frozen (issue 13's goal:
after the first timeout, p99 ≤ 50 ms until it recovers).

A throwaway PostgreSQL cluster (``tests/_pgcluster.py``: initdb in a temporary directory,
as the ``postgres`` user, on a free port) gets a warm-up write, then the whole server is
frozen (``SIGSTOP``) and a ``TranscriptWriter`` (outbox in a local SQLite file) writes
``--writes`` batches, each timed; then the server is thawed, the outbox drained, and the
rows counted with plain SQL against what was sent. Prints the first write's latency
(the deadline, spent once) and the percentiles of the rest.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _pgcluster import ThrowawayCluster

from sessionrepo import TranscriptWriter, open_repository


def _message(index: int) -> dict[str, object]:
    return {"role": "user", "content": f"frozen {index}", "client_msg_uuid": str(uuid.uuid4())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.frozen", description=__doc__)
    parser.add_argument("--writes", type=int, default=500)
    parser.add_argument("--deadline", type=float, default=2.0)
    args = parser.parse_args(argv)
    cluster = ThrowawayCluster()
    try:
        cluster.start()
        name = cluster.fresh_database()
        url = cluster.url_for(name)
        outbox = Path(tempfile.mkdtemp()) / "outbox.db"
        sent: list[dict[str, object]] = [_message(0)]
        with (
            open_repository(url) as repository,
            TranscriptWriter(
                repository, outbox_url=f"sqlite:///{outbox}", deadline=args.deadline
            ) as writer,
        ):
            assert writer.write("frozen", sent).status == "stored"
            cluster.freeze()
            latencies = []
            try:
                for index in range(1, args.writes + 1):
                    message = _message(index)
                    started = time.perf_counter()
                    result = writer.write("frozen", [message])
                    latencies.append(time.perf_counter() - started)
                    assert result.status == "parked", result
                    sent.append(message)
            finally:
                cluster.thaw()
            while writer.pending():
                writer.drain(ignore_backoff=True)
        with psycopg.connect(cluster.conninfo(name)) as conn:
            stored = [
                str(key)
                for (key,) in conn.execute(
                    "SELECT client_msg_uuid FROM messages WHERE session_id = 'frozen' ORDER BY seq"
                )
            ]
        rest = sorted(latencies[1:])
        p99 = rest[int(0.99 * (len(rest) - 1))]
        print(
            f"frozen primary, deadline {args.deadline:g} s, {args.writes} writes: first "
            f"{latencies[0] * 1000:.0f} ms; then median {statistics.median(rest) * 1000:.1f} ms, "
            f"p99 {p99 * 1000:.1f} ms, max {rest[-1] * 1000:.1f} ms; "
            f"stored after the thaw: {len(stored)} of {len(sent)} sent, in order: "
            f"{stored == [m['client_msg_uuid'] for m in sent]}"
        )
        return 0 if stored == [m["client_msg_uuid"] for m in sent] else 1
    finally:
        cluster.destroy()


if __name__ == "__main__":
    sys.exit(main())
