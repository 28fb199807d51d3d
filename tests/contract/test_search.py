"""Full-text search: the same answers on both backends, no query is a syntax error, and
a broken index never blocks a transcript write."""

from __future__ import annotations

import random
import sqlite3
from datetime import UTC, datetime
from typing import Any

import pytest

import sessionrepo.store.search_index
from sessionrepo import Message, SearchIndexUnavailable, SessionRepository, open_repository

pytestmark = pytest.mark.contract  # every repo test runs on the sync and async API

USER_QUERIES = [
    '"',
    "AND",
    "hello AND",
    "NEAR(",
    "*",
    "col:x",
    "!!!",
    "100%",
    "a_b",
    "'; drop table x; --",
    "OR NOT",
    "-",
    '"unterminated phrase',
    "(((",
    "^caret",
    "\x00nul",
    "\ud800",  # a lone surrogate: no word in it, so nothing to find
]


def _seed(repo: SessionRepository) -> None:
    repo.create_session("cats", source="discord", user_id="alice")
    repo.create_session("trips", source="telegram", user_id="bob")
    repo.append(
        "cats",
        [
            Message(role="user", content="Tell me about Mochi the cat", timestamp=1_000),
            Message(role="assistant", content="Mochi is a fluffy cat who likes the café"),
            Message(role="user", content="Does Mochi like mice?", timestamp=3_000),
        ],
    )
    repo.append(
        "trips",
        [
            Message(role="user", content="東京タワーに行きました", timestamp=2_000),
            Message(role="assistant", content="Москва is cold in winter 🥶"),
            Message(
                role="user",
                content=[{"type": "text", "text": "a photo of Mochi on the plane"}],
            ),
        ],
    )


def _found(hits: list) -> list[tuple[str, int]]:
    return sorted((hit.session_id, hit.seq) for hit in hits)


def test_words_are_all_required_and_case_and_accents_do_not_matter(
    repo: SessionRepository,
) -> None:
    _seed(repo)
    assert _found(repo.search("mochi")) == [("cats", 1), ("cats", 2), ("cats", 3), ("trips", 3)]
    assert _found(repo.search("MOCHI cat")) == [("cats", 1), ("cats", 2)]
    assert _found(repo.search("cafe")) == [("cats", 2)]


def test_phrase_prefix_and_exclusion(repo: SessionRepository) -> None:
    _seed(repo)
    assert _found(repo.search('"fluffy cat"')) == [("cats", 2)]
    assert _found(repo.search('"cat fluffy"')) == []
    assert _found(repo.search("flu*")) == [("cats", 2)]
    assert _found(repo.search("mochi -cat")) == [("cats", 3), ("trips", 3)]
    assert _found(repo.search('mochi -"the cat"')) == [("cats", 2), ("cats", 3), ("trips", 3)]
    assert repo.search("-mochi") == []  # nothing to look for


def test_non_latin_text_and_emoji_are_findable(repo: SessionRepository) -> None:
    _seed(repo)
    assert _found(repo.search("東京")) == [("trips", 1)]
    assert _found(repo.search("москва")) == [("trips", 2)]
    assert _found(repo.search("🥶")) == [("trips", 2)]
    [hit] = repo.search("東京")
    assert hit.snippet == "[東京]タワーに行きました"


def test_filters_narrow_the_hits(repo: SessionRepository) -> None:
    _seed(repo)
    assert _found(repo.search("mochi", session_id="trips")) == [("trips", 3)]
    assert _found(repo.search("mochi", source="discord", role="assistant")) == [("cats", 2)]
    assert _found(repo.search("mochi", user_id="bob")) == [("trips", 3)]
    since, until = datetime.fromtimestamp(1_000, UTC), 3_000
    assert _found(repo.search("mochi", since=since, until=until, session_id="cats")) == [
        ("cats", 1)
    ]


def test_hits_carry_what_a_caller_shows(repo: SessionRepository) -> None:
    _seed(repo)
    [hit] = repo.search("fluffy")
    assert (hit.session_id, hit.seq, hit.role, hit.source, hit.user_id) == (
        "cats",
        2,
        "assistant",
        "discord",
        "alice",
    )
    assert hit.snippet == "Mochi is a [fluffy] cat who likes the café"
    assert hit.timestamp.tzinfo is not None


def test_rank_and_newest_orders_and_pagination(repo: SessionRepository) -> None:
    repo.append(
        "s",
        [
            Message(role="user", content=f"{'mochi ' * (i % 3 + 1)}filler {i}", timestamp=i)
            for i in range(1, 26)
        ],
    )
    newest = repo.search("mochi", order="newest", limit=10)
    assert [hit.seq for hit in newest] == list(range(25, 15, -1))
    pages = []
    for page in range(3):
        pages += repo.search("mochi", order="newest", limit=10, cursor=page * 10)
    assert [hit.seq for hit in pages] == list(range(25, 0, -1))
    ranked = repo.search("mochi", order="rank", limit=25)
    assert [hit.rank for hit in ranked] == sorted((hit.rank for hit in ranked), reverse=True)
    assert ranked[0].snippet.count("[mochi]") == 3


@pytest.mark.parametrize("query", USER_QUERIES)
def test_no_user_query_raises(repo: SessionRepository, query: str) -> None:
    _seed(repo)
    repo.search(query)  # any answer, but never a syntax error
    assert repo.load_transcript("cats")  # and nothing was harmed


def test_ten_kilobytes_of_random_text_is_just_text(repo: SessionRepository) -> None:
    _seed(repo)
    rng = random.Random(7)
    alphabet = "abc XYZ \"*-:()^!%_'; 東京🥶\\\t\n"
    for _ in range(5):
        repo.search("".join(rng.choice(alphabet) for _ in range(10_000)))


def test_a_twenty_megabyte_tool_output_is_stored_and_its_first_words_are_findable(
    repo: SessionRepository,
) -> None:
    output = "compilation started zanzibar " + "0123456789abcdef\n" * (20 * 1024 * 1024 // 17)
    result = repo.append("big", [Message(role="tool", tool_call_id="c1", content=output)])
    assert result.inserted
    assert repo.load_transcript("big")[0].content == output
    [hit] = repo.search("zanzibar")
    assert hit.session_id == "big"
    assert repo.search_index_state() == ("ok", None)


def test_reindex_finds_everything_again(repo: SessionRepository) -> None:
    _seed(repo)
    seen: list[tuple[int, int]] = []
    assert repo.reindex(progress=lambda done, total: seen.append((done, total))) == 6
    assert seen[-1] == (6, 6)
    assert _found(repo.search("mochi")) == [("cats", 1), ("cats", 2), ("cats", 3), ("trips", 3)]


# -- SQLite index corruption: backend-specific by nature ------------------------------


def _corrupt(path: str, how: str) -> None:
    with sqlite3.connect(path) as conn:
        if how == "garbled-data":
            conn.execute("UPDATE messages_fts_data SET block = randomblob(length(block))")
        elif how == "deleted-structure":
            conn.execute("DELETE FROM messages_fts_data WHERE id = 10")
        elif how == "out-of-sync":
            # The index names messages for words they do not contain.
            conn.execute("UPDATE messages_fts_content SET c1 = c1 + 1")
            conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")


@pytest.mark.sqlite
@pytest.mark.parametrize("how", ["garbled-data", "deleted-structure", "out-of-sync"])
def test_sqlite_a_corrupt_index_blocks_no_write_and_reindex_repairs_it(
    tmp_path: object, sqlite_template: object, how: str
) -> None:
    import shutil

    path = f"{tmp_path}/store.db"
    shutil.copyfile(str(sqlite_template), path)
    repo = open_repository(f"sqlite:///{path}")
    try:
        repo.append("s", [Message(role="user", content=f"before {i} zebra") for i in range(5)])
        repo.append("other", [Message(role="user", content="zebra crossing")])
        assert repo.catch_up_search_index() == 6  # an index with something to corrupt
        repo.close()
        _corrupt(path, how)
        repo = open_repository(f"sqlite:///{path}")

        for i in range(50):
            result = repo.append("s", [Message(role="user", content=f"after {i} giraffe")])
            assert result.inserted
        assert len(repo.load_transcript("s")) == 55

        with pytest.raises(SearchIndexUnavailable, match="reindex"):
            repo.search("zebra")
        assert repo.search_index_state()[0] == "stale"

        assert repo.reindex() == 56
        assert repo.search_index_state() == ("ok", None)
        assert len(repo.search("giraffe", limit=100)) == 50
        assert len(repo.search("zebra")) == 6
    finally:
        repo.close()


def test_a_bulk_load_without_indexing_leaves_search_refusing_until_reindex(
    database_url: str,
) -> None:
    with open_repository(database_url, search_index=False) as bulk:
        bulk.append("s", [Message(role="user", content="okapi")])
        with pytest.raises(SearchIndexUnavailable):
            bulk.search("okapi")
        assert bulk.reindex() == 1
        assert _found(bulk.search("okapi")) == [("s", 1)]


# -- order, windows and filters inside the index ---------------------------------------


def test_newest_is_by_message_time_not_by_when_it_was_stored(repo: SessionRepository) -> None:
    # An import stores old messages after new ones: "newest" still means by timestamp.
    repo.append(
        "new", [Message(role="user", content=f"okapi {i}", timestamp=9_000 + i) for i in range(3)]
    )
    repo.append(
        "old", [Message(role="user", content=f"okapi {i}", timestamp=1_000 + i) for i in range(3)]
    )
    repo.append("mid", [Message(role="user", content="okapi mid", timestamp=5_000)])
    hits = repo.search("okapi", order="newest", limit=10)
    assert [(hit.session_id, hit.seq) for hit in hits] == [
        ("new", 3),
        ("new", 2),
        ("new", 1),
        ("mid", 1),
        ("old", 3),
        ("old", 2),
        ("old", 1),
    ]
    assert [hit.timestamp for hit in hits] == sorted((hit.timestamp for hit in hits), reverse=True)
    since = datetime.fromtimestamp(5_000, UTC)
    assert [hit.session_id for hit in repo.search("okapi", order="newest", since=since)] == [
        "new",
        "new",
        "new",
        "mid",
    ]
    assert [hit.seq for hit in repo.search("okapi", order="rank", until=since)] != []
    assert {hit.session_id for hit in repo.search("okapi", until=since)} == {"old"}


def test_many_messages_in_one_millisecond_are_all_indexed_and_found(
    repo: SessionRepository,
) -> None:
    # More than the index has slots for one millisecond (256): none is lost or refused.
    for start in range(0, 600, 200):
        repo.append(
            "burst",
            [
                Message(role="user", content=f"lemur {start + i}", timestamp=7_000)
                for i in range(200)
            ],
        )
    repo.append("after", [Message(role="user", content="lemur later", timestamp=7_001)])
    assert repo.search_index_state() == ("ok", None)
    seen: list[tuple[str, int]] = []
    for page in range(7):
        seen += [
            (h.session_id, h.seq)
            for h in repo.search("lemur", order="newest", limit=100, cursor=page * 100)
        ]
    assert len(seen) == len(set(seen)) == 601
    assert seen[0] == ("after", 1)


def test_rank_orders_the_newest_window_of_matches(repo: SessionRepository) -> None:
    from sessionrepo.store.search_index import RANK_WINDOW

    old = [Message(role="user", content="tapir " * 5, timestamp=1_000 + i) for i in range(5)]
    new = [
        Message(role="user", content=f"tapir and other words {i}", timestamp=10_000 + i)
        for i in range(RANK_WINDOW)
    ]
    repo.append("s", old)
    repo.append("s", new)
    ranked = repo.search("tapir", order="rank", limit=1000)
    # The five strongest matches are older than the window: ranking does not reach them.
    assert len(ranked) == RANK_WINDOW
    assert all(hit.seq > len(old) for hit in ranked)
    assert repo.search("tapir", order="rank", limit=10, cursor=RANK_WINDOW) == []
    assert len(repo.search("tapir", order="newest", limit=10, cursor=RANK_WINDOW)) == 5


def test_role_and_session_filters_are_exact(repo: SessionRepository) -> None:
    _seed(repo)
    assert repo.search("mochi", role="User") == []  # roles are exact, and never a syntax
    assert repo.search("mochi", role='x" OR "') == []
    assert repo.search("mochi", session_id='"; --') == []
    assert _found(repo.search("mochi", role="user", order="newest")) == [
        ("cats", 1),
        ("cats", 3),
        ("trips", 3),
    ]
    assert _found(repo.search("mochi", session_id="cats", role="assistant")) == [("cats", 2)]


def test_index_words_are_the_words_of_the_text(repo: SessionRepository) -> None:
    from sessionrepo.search.text import WORD, document, normalize

    samples = [
        "Plain ASCII, with punctuation: a_b x-y 3.14 e-mail@example.com\tTAB\nline",
        "Café, naïve façade — résumé ÉCOLE ﬁne ²",
        "東京タワーに行きました 🥶👍🏽 Москва ЁЖИК\u00a0nbsp\u3000wide",
        "mixed ascii then ünïcödé then ascii again " * 3,
        "e\u0301 combining at the start \u0301 and alone",
    ]
    for text in samples:
        assert document(text).split() == WORD.findall(normalize(text))


def test_a_pruned_session_leaves_nothing_in_the_index(database_url: str) -> None:
    from datetime import timedelta

    from sessionrepo.models.message import utcnow
    from sessionrepo.ops import prune_sessions

    from support.corpus import set_times

    with open_repository(database_url) as repo:
        repo.append("gone", [Message(role="user", content=f"wombat {i}") for i in range(3)])
        repo.append("kept", [Message(role="user", content="wombat kept")])
        repo.end_session("gone", "done")
        long_ago = utcnow() - timedelta(days=400)
        set_times(database_url, "gone", ended_at=long_ago, last_active_at=long_ago)
        assert repo.search_index_backlog() == 4  # not indexed yet when pruned
        report = prune_sessions(repo, cutoff=utcnow() - timedelta(days=30))
        assert report.session_ids == ["gone"]
        assert repo.search_index_backlog() == 1  # the pruned session's rows went with it
        # The same id again, with other words: no hit may come from the pruned messages.
        repo.append("gone", [Message(role="user", content="koala")])
        assert _found(repo.search("wombat", limit=100)) == [("kept", 1)]
        assert _found(repo.search("koala")) == [("gone", 1)]
        assert repo.search_index_state() == ("ok", None)


# -- the backlog: appends name their messages, catch-ups index them --------------------


def test_appended_messages_are_found_by_the_next_search(repo: SessionRepository) -> None:
    repo.append("s", [Message(role="user", content=f"ocelot {i}") for i in range(3)])
    repo.append("t", [Message(role="user", content="ocelot again")])
    assert repo.search_index_backlog() == 4  # named in the appends' transactions
    assert _found(repo.search("ocelot")) == [("s", 1), ("s", 2), ("s", 3), ("t", 1)]
    assert repo.search_index_backlog() == 0
    repo.append("s", [Message(role="assistant", content="one more ocelot")])
    assert _found(repo.search("ocelot", role="assistant")) == [("s", 4)]
    assert repo.search_index_state() == ("ok", None)


def test_catch_up_indexes_the_backlog_once(repo: SessionRepository) -> None:
    repo.append("s", [Message(role="user", content=f"ibis {i}") for i in range(5)])
    repo.append("s", [Message(role="user", content="ibis five")])
    assert repo.catch_up_search_index() == 6
    assert repo.search_index_backlog() == 0
    assert repo.catch_up_search_index() == 0
    assert len(repo.search("ibis")) == 6


def test_a_search_catches_up_what_came_before_it_not_what_keeps_coming(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setattr(
        sessionrepo.store.search_index, "CATCH_UP_ROWS", 1
    )  # one append per transaction
    with open_repository(database_url) as store, open_repository(database_url) as gateway:
        for i in range(5):
            store.append(f"s{i}", [Message(role="user", content=f"egret {i}")])
        # A gateway that appends again before every transaction of the search's catch-up:
        # a catch-up that chased the backlog would never end (here: 40 more, then stop).
        during: list[int] = []
        write = store.database.write

        def busy_write(work: Any) -> Any:
            if len(during) < 40:
                during.append(len(during))
                gateway.append("late", [Message(role="user", content=f"egret late {len(during)}")])
            return write(work)

        monkeypatch.setattr(store.database, "write", busy_write)
        found = _found(store.search("egret", limit=100))
        assert {(f"s{i}", 1) for i in range(5)} <= set(found)  # all it came after
        # It did the five rows it found and one transaction to see each was done: the
        # messages that came meanwhile wait for the next catch-up.
        assert 0 < len(during) <= 10
        assert store.search_index_backlog() == len(during)


def test_reindex_empties_the_backlog(repo: SessionRepository) -> None:
    repo.append("s", [Message(role="user", content=f"heron {i}") for i in range(4)])
    assert repo.search_index_backlog() == 4
    assert repo.reindex() == 4
    assert repo.search_index_backlog() == 0
    assert len(repo.search("heron")) == 4  # indexed by the rebuild, and only once


def test_immediate_mode_indexes_in_the_append(database_url: str) -> None:
    with open_repository(database_url, search_index="immediate") as repo:
        repo.append("s", [Message(role="user", content=f"puffin {i}") for i in range(3)])
        assert repo.search_index_backlog() == 0
        assert repo.search_index_state() == ("ok", None)
        assert _found(repo.search("puffin")) == [("s", 1), ("s", 2), ("s", 3)]
    with open_repository(database_url) as deferred:  # the modes mix: each indexed once
        deferred.append("s", [Message(role="user", content="puffin later")])
        assert len(deferred.search("puffin")) == 4


def test_the_writers_drainer_catches_up(database_url: str) -> None:
    from sessionrepo import TranscriptWriter

    with open_repository(database_url) as repo, TranscriptWriter(repo) as writer:
        writer.write("s", [Message(role="user", content=f"marmot {i}") for i in range(3)])
        assert repo.search_index_backlog() == 3
        writer.drain_round(1.0)
        assert repo.search_index_backlog() == 0
        assert len(repo.search("marmot")) == 3


def _index_entries(database_url: str) -> int:
    from sqlalchemy import create_engine

    engine = create_engine(database_url)
    table = "messages_fts" if engine.dialect.name == "sqlite" else "message_search"
    try:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one())
    finally:
        engine.dispose()


def test_concurrent_appends_and_searches_find_every_message_once(database_url: str) -> None:
    import threading

    appenders, batches, size = 2, 25, 4
    start = threading.Barrier(4)
    appending = threading.Event()
    appending.set()
    errors: list[BaseException] = []

    with open_repository(database_url) as repo:

        def append(worker: int) -> None:
            try:
                start.wait()
                for batch in range(batches):
                    repo.append(
                        f"w{worker}-{batch % 3}",
                        [
                            Message(role="user", content=f"narwhal {worker} {batch} {i}")
                            for i in range(size)
                        ],
                    )
            except BaseException as exc:
                errors.append(exc)

        def search(worker: int) -> None:
            try:
                start.wait()
                while appending.is_set():
                    if worker:
                        repo.catch_up_search_index()
                    repo.search("narwhal", order="newest", limit=50)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=append, args=(n,)) for n in range(appenders)]
        searchers = [threading.Thread(target=search, args=(n,)) for n in range(2)]
        for thread in threads + searchers:
            thread.start()
        for thread in threads:
            thread.join()
        appending.clear()
        for thread in searchers:
            thread.join()
        assert errors == []

        total = appenders * batches * size
        seen: list[tuple[str, int]] = []
        while page := repo.search("narwhal", order="newest", limit=1000, cursor=len(seen)):
            seen += [(hit.session_id, hit.seq) for hit in page]
        assert len(seen) == len(set(seen)) == total
        assert repo.search_index_backlog() == 0
        assert repo.search_index_state() == ("ok", None)
    assert _index_entries(database_url) == total  # nothing indexed twice


def _break_index(database_url: str, *, broken: bool) -> None:
    """Make indexing fail (or work again): SQLite loses its FTS5 table (``reindex``
    recreates it), PostgreSQL's index table refuses every new row."""
    from sqlalchemy import create_engine

    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "sqlite":
                if broken:
                    conn.exec_driver_sql("ALTER TABLE messages_fts RENAME TO broken_fts")
            elif broken:
                conn.exec_driver_sql(
                    "ALTER TABLE message_search ADD CONSTRAINT ck_broken CHECK (false) NOT VALID"
                )
            else:
                conn.exec_driver_sql("ALTER TABLE message_search DROP CONSTRAINT ck_broken")
    finally:
        engine.dispose()


def test_a_failing_catch_up_marks_the_index_stale_and_appends_go_on(database_url: str) -> None:
    with open_repository(database_url) as repo:
        repo.append("s", [Message(role="user", content="gecko one")])
        assert len(repo.search("gecko")) == 1
        _break_index(database_url, broken=True)
        for i in range(5):
            assert repo.append("s", [Message(role="user", content=f"gecko {i}")]).inserted
        assert repo.catch_up_search_index() == 0  # failed: marked, not raised
        assert repo.search_index_state()[0] == "stale"
        assert repo.append("s", [Message(role="user", content="gecko after")]).inserted
        with pytest.raises(SearchIndexUnavailable, match="reindex"):
            repo.search("gecko")
        _break_index(database_url, broken=False)
        assert repo.reindex() == 7
        assert repo.search_index_backlog() == 0
        assert len(repo.search("gecko")) == 7


def test_doctor_reports_the_backlog(database_url: str) -> None:
    from sessionrepo.ops import run_doctor

    with open_repository(database_url) as repo:
        repo.append("s", [Message(role="user", content=f"dingo {i}") for i in range(3)])
        [check] = [c for c in run_doctor(database_url).checks if c.name == "search"]
        assert check.status == "ok"
        assert "3 messages wait for indexing" in check.detail
        repo.search("dingo")
        [check] = [c for c in run_doctor(database_url).checks if c.name == "search"]
        assert "backlog empty" in check.detail
