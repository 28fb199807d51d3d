"""`sessionrepo search`, `reindex`, and doctor's view of the search index."""

from __future__ import annotations

import json

from click.testing import CliRunner

from sessionrepo import Message, open_repository
from sessionrepo.cli import main


def _seed(url: str) -> None:
    with open_repository(url) as repo:
        repo.append("cats", [Message(role="user", content="Mochi chased the red dot")])
        repo.append("dogs", [Message(role="user", content="Rex chased the ball")])


def test_search_prints_hits_and_json(database_url: str) -> None:
    _seed(database_url)
    runner = CliRunner()

    text = runner.invoke(main, ["--url", database_url, "search", "chased -rex"])
    assert text.exit_code == 0, text.output
    assert "cats #1" in text.stdout
    assert "[chased]" in text.stdout
    assert "dogs" not in text.stdout

    as_json = runner.invoke(main, ["--url", database_url, "search", "chased", "--json"])
    assert as_json.exit_code == 0, as_json.output
    hits = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert sorted(hit["session_id"] for hit in hits) == ["cats", "dogs"]


def test_a_stale_index_fails_search_and_doctor_until_reindex(database_url: str) -> None:
    with open_repository(database_url, search_index=False) as bulk:
        bulk.append("s", [Message(role="user", content="okapi sighting")])
    runner = CliRunner()

    refused = runner.invoke(main, ["--url", database_url, "search", "okapi"])
    assert refused.exit_code == 1
    assert "reindex" in refused.stderr
    doctor = runner.invoke(main, ["--url", database_url, "doctor"])
    assert doctor.exit_code != 0
    assert "sessionrepo reindex" in doctor.stdout

    rebuilt = runner.invoke(main, ["--url", database_url, "reindex"])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "indexed 1 message" in rebuilt.stdout
    found = runner.invoke(main, ["--url", database_url, "search", "okapi"])
    assert found.exit_code == 0
    assert "s #1" in found.stdout
    assert runner.invoke(main, ["--url", database_url, "doctor"]).exit_code == 0
