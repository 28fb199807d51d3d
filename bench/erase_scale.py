"""Forgetting at scale (issue 27): what erase, scrub and retention cost on a store of
1,000,000 messages, on SQLite and PostgreSQL, and that the erased text is gone after.

``python -m bench.erase_scale [--messages 1000000] [--postgres-url URL] [--keep DIR]``.
Makes the schema with the migrations, seeds it with plain SQL bulk inserts (SQLAlchemy
Core ``executemany`` of the tables' own ``INSERT``, as ``bench.usage_scale`` does):
``--messages / 100`` sessions of 100 messages of about 200 bytes each, then builds the
search index with ``reindex()`` and runs ``ANALYZE``. That seeded store is the template
every run copies (a file copy on SQLite, ``CREATE DATABASE … TEMPLATE`` on PostgreSQL),
so a run erases from the same rows; ``--keep DIR`` keeps it for the next run.

Who is erased: three people with 1, 10 and 100 sessions (100, 1,000 and 10,000
messages), each message holding a word of their own, and one session of a fourth; then a
retention policy that finds 100 idle sessions due. A parked copy of the 1-session
person's last message waits in a gateway's outbox file (parked while the primary's
write lock was held), drained after the erasure. Timed, each once (a run is destructive):

- ``erase(user_id=…, scrub=False)`` per person (the deletes and tombstones, one unit
  of work per session), a dry run first; then ``scrub_erased()`` (SQLite: FTS5
  ``optimize``, zeroing the unused space of the content tables' pages and the free
  pages, WAL checkpoint; PostgreSQL: ``VACUUM``);
- ``erase(session_id=…)`` with its scrub (one session, the default call);
- ``apply_retention`` (a dry run, then the sweep with its scrub);
- then ``verify_erased`` over every erased word: the rows, the index and, on SQLite, the
  bytes of the database file, its WAL and the outbox file and its WAL (what it finds is
  recorded); then ``scrub_erased(compact=True)`` (``VACUUM``; PostgreSQL ``VACUUM
  FULL``) and the scan again: not clean then, the run fails.

Writes ``bench/results/erase-scale.json`` and ``.md`` with the load average before and
after (the machine is shared: figures are of one run, not a rate to hold anyone to).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, Table, create_engine, make_url, text

from sessionrepo import Message, SessionRepository, TranscriptWriter, open_repository
from sessionrepo.models.privacy import RetentionPolicy
from sessionrepo.ops.erase import verify_erased

RESULTS = Path(__file__).parent / "results"
PER_SESSION = 100
START = datetime(2026, 9, 1, tzinfo=UTC)
DAYS = 90
SOURCES = ("discord", "slack", "telegram", "whatsapp", "cli")
CHUNK = 10_000
#: The people erased (their user id and how many sessions each has), then the session
#: erased alone; their sessions come first (by id), the others' after.
PEOPLE = (("p1", 1), ("p10", 10), ("p100", 100))
SOLO = "solo"
#: How many idle sessions the retention policy finds due.
RETAINED = 100
FILLER = (
    "could you look at the deployment logs again and tell me why the worker keeps "
    "restarting after midnight, the config did not change since last week"
)
KEEP_DATABASE = "sessionrepo_erasescale_seed"
#: Holds the primary's write lock while its block runs.
Lock = Callable[[], AbstractContextManager[None]]


def _marker(user: str) -> str:
    """The word only ``user``'s messages hold (what the byte scan looks for)."""
    return f"zq{user}secretword"


def _owners(sessions: int) -> list[str]:
    owners: list[str] = []
    for user, count in PEOPLE:
        owners += [user] * count
    owners.append(SOLO)
    owners += [f"u{index % 200:03d}" for index in range(sessions - len(owners))]
    return owners


def _started(index: int, sessions: int) -> datetime:
    return START + timedelta(seconds=index * DAYS * 86400 // sessions)


def _sessions(owners: list[str]) -> Iterator[dict[str, Any]]:
    for index, owner in enumerate(owners):
        started = _started(index, len(owners))
        yield {
            "id": f"s{index:06d}",
            "source": SOURCES[index % len(SOURCES)],
            "user_id": owner,
            "title": f"chat {index}",
            "started_at": started,
            "last_active_at": started + timedelta(hours=2),
            "next_seq": PER_SESSION + 1,
            "message_count": PER_SESSION,
        }


def _messages(owners: list[str]) -> Iterator[dict[str, Any]]:
    for index, owner in enumerate(owners):
        started = _started(index, len(owners))
        word = _marker(owner) if not owner.startswith("u") else "nothing"
        for seq in range(1, PER_SESSION + 1):
            content = f"{word} message {seq} of session {index}: {FILLER}"
            yield {
                "session_id": f"s{index:06d}",
                "seq": seq,
                "client_msg_uuid": uuid.uuid5(uuid.NAMESPACE_OID, f"{index}/{seq}"),
                "role": "user" if seq % 2 else "assistant",
                "content": content,
                "timestamp": started + timedelta(seconds=seq * 60),
                "content_hash": hashlib.md5(content.encode()).digest(),
            }


def _insert(conn: Any, table: Table, rows: Iterator[dict[str, Any]], postgres: bool) -> None:
    chunk: list[dict[str, Any]] = []
    for row in rows:
        # Reflected tables (bench/ uses only the library's public names): a uuid as
        # SQLite's CHAR(32) holds it, hex.
        chunk.append(
            row
            if postgres
            else {k: v.hex if isinstance(v, uuid.UUID) else v for k, v in row.items()}
        )
        if len(chunk) == CHUNK:
            conn.execute(table.insert(), chunk)
            chunk = []
    if chunk:
        conn.execute(table.insert(), chunk)


def seed(url: str, messages: int) -> dict[str, float]:
    """Fill the migrated store at ``url``; seconds of the rows and of the index."""
    owners = _owners(messages // PER_SESSION)
    engine = create_engine(url)
    postgres = engine.dialect.name == "postgresql"
    began = time.perf_counter()
    try:
        metadata = MetaData()
        metadata.reflect(engine, only=["sessions", "messages"])
        with engine.begin() as conn:
            _insert(conn, metadata.tables["sessions"], _sessions(owners), postgres)
            _insert(conn, metadata.tables["messages"], _messages(owners), postgres)
        rows = time.perf_counter() - began
        began = time.perf_counter()
        with open_repository(url, embedder=False) as repository:
            repository.reindex()
        index = time.perf_counter() - began
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE" if postgres else "ANALYZE"))
    finally:
        engine.dispose()
    return {"rows_s": round(rows, 1), "index_s": round(index, 1)}


def _timed(work: Any) -> tuple[Any, float]:
    began = time.perf_counter()
    result = work()
    return result, round(time.perf_counter() - began, 3)


def _park(repository: SessionRepository, outbox: Path, lock: Lock) -> str:
    """Park a copy of the 1-session person's newest message in a gateway's outbox
    file: written while ``lock`` holds the primary's write lock, so the write's
    deadline passes and the batch parks."""
    sid = "s000000"
    last = repository.load_transcript(sid)[-1]
    copy = Message.model_validate(last.model_dump(exclude={"session_id", "seq", "superseded"}))
    writer = TranscriptWriter(repository, outbox_url=f"sqlite:///{outbox}", deadline=0.5)
    try:
        with lock():
            result = writer.write(sid, [copy])
        if result.status != "parked":
            raise SystemExit(f"the outbox copy was not parked ({result.status})")
    finally:
        writer.close()
    return sid


@contextmanager
def _sqlite_lock(path: Path) -> Iterator[None]:
    """The store's write lock held (``BEGIN IMMEDIATE``) until the block ends."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


@contextmanager
def _postgres_lock(url: str) -> Iterator[None]:
    """``messages`` locked against writes until the block ends."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn, conn.begin():
            conn.execute(text("LOCK TABLE messages IN EXCLUSIVE MODE"))
            yield
    finally:
        engine.dispose()


def measure(url: str, folder: Path, lock: Lock, sessions: int) -> dict[str, Any]:
    """The timed erasures on a fresh copy of the seeded store (see the docstring)."""
    report: dict[str, Any] = {}
    outbox = folder / "gateway-outbox.db"
    with open_repository(url, embedder=False) as repository:
        _park(repository, outbox, lock)
        for user, count in PEOPLE:
            dry, dry_s = _timed(lambda u=user: repository.erase(user_id=u, dry_run=True))
            done, erase_s = _timed(lambda u=user: repository.erase(user_id=u, scrub=False))
            scrub, scrub_s = _timed(repository.scrub_erased)
            if (dry.counts.sessions, done.counts.sessions) != (count, count):
                raise SystemExit(f"{user}: {done.counts.sessions} sessions erased, not {count}")
            report[f"erase_user_{count}_sessions"] = {
                "messages": done.counts.live_messages,
                "dry_run_s": dry_s,
                "erase_s": erase_s,
                "scrub_s": scrub_s,
                "scrub_steps": scrub.steps,
                "scrub_complete": scrub.complete,
            }
            print(f"  {user}: {report[f'erase_user_{count}_sessions']}", flush=True)
        solo = f"s{sum(count for _, count in PEOPLE):06d}"
        done, solo_s = _timed(lambda: repository.erase(session_id=solo))
        report["erase_one_session_with_scrub"] = {
            "messages": done.counts.live_messages,
            "total_s": solo_s,
            "scrub_s": round(done.scrub.seconds, 3) if done.scrub else None,
            "scrub_steps": done.scrub.steps if done.scrub else [],
        }
        print(f"  one session: {report['erase_one_session_with_scrub']}", flush=True)
        # Idle for 30 days: the RETAINED oldest sessions left (those after the erased),
        # whose last activity is 2 hours after their start.
        first = sum(count for _, count in PEOPLE) + 1
        cutoff = _started(first + RETAINED, sessions) + timedelta(hours=2, seconds=-1)
        now = cutoff + timedelta(days=30)
        repository.set_retention_policy(RetentionPolicy(source="*", idle_days=30))
        due, due_s = _timed(lambda: repository.apply_retention(dry_run=True, now=now))
        swept, sweep_s = _timed(lambda: repository.apply_retention(now=now, actor="bench"))
        if len(swept.session_ids) != RETAINED or len(due.session_ids) != RETAINED:
            raise SystemExit(f"retention erased {len(swept.session_ids)}, not {RETAINED}")
        report["retention_sweep"] = {
            "sessions": len(swept.session_ids),
            "messages": swept.counts.live_messages,
            "dry_run_s": due_s,
            "sweep_s": sweep_s,
        }
        print(f"  retention: {report['retention_sweep']}", flush=True)
        writer = TranscriptWriter(repository, outbox_url=f"sqlite:///{outbox}")
        try:
            drained = writer.drain()
        finally:
            writer.close()
        words = [_marker(user) for user, _ in PEOPLE] + [_marker(SOLO)]
        found, verify_s = _timed(lambda: verify_erased(repository, words, files=[outbox]))
        # Then the whole file (table) rewritten: VACUUM on SQLite, VACUUM FULL on
        # PostgreSQL, and the scan again.
        compacted, compact_s = _timed(lambda: repository.scrub_erased(compact=True))
        again = verify_erased(repository, words, files=[outbox])
        report["after"] = {
            "outbox_drain_refused": drained.erased,
            "verify_erased_s": verify_s,
            "scanned": found.scanned,
            "clean": found.clean,
            # Which word (by PEOPLE's order, then SOLO's), where and how often.
            "findings": [f.model_dump() for f in found.findings],
            "compact_s": compact_s,
            "compact_steps": compacted.steps,
            "clean_after_compact": again.clean,
        }
        print(f"  after: {report['after']}", flush=True)
    return report


def _migrate(url: str) -> None:
    subprocess.run(
        ["sessionrepo", "migrate"],
        check=True,
        env={
            "SESSIONREPO_DATABASE_URL": url,
            "PATH": str(Path(__file__).resolve().parents[1] / ".venv" / "bin") + ":/usr/bin:/bin",
        },
        stdout=subprocess.DEVNULL,
    )


def run_sqlite(messages: int, keep: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_SQLITE_DIR")) as scratch:
        folder = Path(scratch)
        template = (keep or folder) / "erase-seed.db"
        seeded: dict[str, Any] = {}
        if not template.exists():
            _migrate(f"sqlite:///{template}")
            seeded = seed(f"sqlite:///{template}", messages)
            print(f"  seeded: {seeded}", flush=True)
        store = folder / "store.db"
        shutil.copyfile(template, store)
        size = store.stat().st_size
        report = measure(
            f"sqlite:///{store}", folder, partial(_sqlite_lock, store), messages // PER_SESSION
        )
        report["after"]["file_bytes"] = store.stat().st_size
        wal = store.with_name("store.db-wal")
        report["after"]["wal_bytes"] = wal.stat().st_size if wal.exists() else 0
        return {"messages": messages, "file_bytes_before": size, "seed": seeded, **report}


def run_postgres(server: str, messages: int, keep: bool) -> dict[str, Any]:
    base = make_url(server)
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    seed_name = KEEP_DATABASE if keep else f"sessionrepo_erasescale_seed_{os.getpid()}"
    name = f"sessionrepo_erasescale_{os.getpid()}"
    seeded: dict[str, Any] = {}
    try:
        with admin.connect() as conn:
            there = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": seed_name}
            ).first()
            if there is None:
                conn.execute(text(f'CREATE DATABASE "{seed_name}"'))
        seed_url = base.set(database=seed_name).render_as_string(hide_password=False)
        if there is None:
            _migrate(seed_url)
            seeded = seed(seed_url, messages)
            print(f"  seeded: {seeded}", flush=True)
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{seed_name}"'))
        url = base.set(database=name).render_as_string(hide_password=False)
        with tempfile.TemporaryDirectory() as folder:
            report = measure(
                url, Path(folder), partial(_postgres_lock, url), messages // PER_SESSION
            )
        return {"messages": messages, "seed": seeded, **report}
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            if not keep:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{seed_name}" WITH (FORCE)'))
        admin.dispose()


def _markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Erase, scrub and retention on a 1,000,000-message store",
        "",
        f"`python -m bench.erase_scale`, {results['when']}, {results['cpus']} CPUs, load "
        f"average {results['load_average_before']} before, {results['load_average_after']} "
        "after (a shared machine: one run's figures).",
        "",
        "| step | " + " | ".join(b for b in ("sqlite", "postgresql") if b in results) + " |",
        "|---|" + "---|" * len([b for b in ("sqlite", "postgresql") if b in results]),
    ]
    backends = [b for b in ("sqlite", "postgresql") if b in results]

    def row(label: str, pick: Any) -> None:
        cells = []
        for backend in backends:
            try:
                cells.append(str(pick(results[backend])))
            except (KeyError, TypeError):
                cells.append("-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    for _, count in PEOPLE:
        key = f"erase_user_{count}_sessions"
        row(f"erase a person, {count} session(s): dry run (s)", lambda r, k=key: r[k]["dry_run_s"])
        row(
            f"erase a person, {count} session(s): erase, no scrub (s)",
            lambda r, k=key: r[k]["erase_s"],
        )
        row(f"erase a person, {count} session(s): then scrub (s)", lambda r, k=key: r[k]["scrub_s"])
    row(
        "erase one session with its scrub (s)",
        lambda r: r["erase_one_session_with_scrub"]["total_s"],
    )
    row("  of which the scrub (s)", lambda r: r["erase_one_session_with_scrub"]["scrub_s"])
    row(
        f"retention: dry run, {RETAINED} sessions due (s)",
        lambda r: r["retention_sweep"]["dry_run_s"],
    )
    row("retention: the sweep with its scrub (s)", lambda r: r["retention_sweep"]["sweep_s"])
    row("outbox copy refused at the drain", lambda r: r["after"]["outbox_drain_refused"])
    row("verify_erased (s)", lambda r: r["after"]["verify_erased_s"])
    row(
        "verify_erased clean (rows, index; SQLite: file, WAL, outbox)",
        lambda r: r["after"]["clean"],
    )
    row(
        "  what it found",
        lambda r: (
            "; ".join(
                f"word {f['text']} in {f['where'].rsplit('/', 1)[-1]} x{f['count']}"
                for f in r["after"]["findings"]
            )
            or "nothing"
        ),
    )
    row("then compact=True (VACUUM / VACUUM FULL) (s)", lambda r: r["after"]["compact_s"])
    row("verify_erased clean after it", lambda r: r["after"]["clean_after_compact"])
    row(
        "file bytes before / after",
        lambda r: f"{r['file_bytes_before']:,} / {r['after']['file_bytes']:,}",
    )
    row("WAL bytes after", lambda r: f"{r['after']['wal_bytes']:,}")
    lines += [
        "",
        "Scrub steps (SQLite: FTS5 optimize, pages' unused space and free pages zeroed, WAL "
        "checkpoint):",
        "",
    ]
    for backend in backends:
        for key, value in results[backend].items():
            if isinstance(value, dict) and value.get("scrub_steps"):
                lines.append(f"- {backend}, {key}: {'; '.join(value['scrub_steps'])}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--output", default=str(RESULTS / "erase-scale"))
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="keep the seeded store (DIR/erase-seed.db and the PostgreSQL database "
        f"{KEEP_DATABASE}) and copy it again on the next run",
    )
    args = parser.parse_args(argv)
    if args.messages < PER_SESSION * (sum(c for _, c in PEOPLE) + 1 + 2 * RETAINED):
        parser.error("--messages is too few for the people and the retention sweep")
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_average_before": [round(v, 2) for v in os.getloadavg()],
    }
    keep = Path(args.keep) if args.keep else None
    for backend in args.backends.split(","):
        print(f"{backend}:", flush=True)
        if backend == "sqlite":
            results["sqlite"] = run_sqlite(args.messages, keep)
        else:
            results["postgresql"] = run_postgres(args.postgres_url, args.messages, keep is not None)
    results["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    output = Path(args.output)
    output.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    output.with_suffix(".md").write_text(_markdown(results))
    print(f"wrote {output.with_suffix('.json')} and {output.with_suffix('.md')}")
    dirty = [
        backend
        for backend in ("sqlite", "postgresql")
        if backend in results and not results[backend]["after"]["clean_after_compact"]
    ]
    if dirty:
        raise SystemExit(f"erased text found after the compaction on {', '.join(dirty)}")


if __name__ == "__main__":
    main()
