"""A listed session says whether it is open or ended (``SessionSummary.status``, what
``list_sessions(status=...)`` filters on), in Python, in JSON and on the command line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sessionrepo import SessionStore, SessionSummary, open_repository
from sessionrepo.cli import main

pytestmark = pytest.mark.contract  # every repo test runs on the sync and async API


def test_a_summary_has_the_status_the_filter_uses(repo: SessionStore) -> None:
    repo.append("live", [{"role": "user", "content": "hi"}])
    repo.append("over", [{"role": "user", "content": "bye"}])
    repo.end_session("over", "done")

    everything = {s.id: s.status for s in repo.list_sessions().sessions}
    assert everything == {"live": "open", "over": "ended"}
    for status in ("open", "ended"):
        listed = repo.list_sessions(status=status).sessions
        assert [s.status for s in listed] == [status]

    summary = repo.list_sessions(status="ended").sessions[0]
    dumped = summary.model_dump(mode="json")
    assert dumped["status"] == "ended"
    assert SessionSummary.model_validate(dumped) == summary  # a dump validates again
    with pytest.raises(ValueError, match="status"):
        SessionSummary.model_validate({**dumped, "status": "open"})


def test_sessions_list_json_has_the_status(database_url: str) -> None:
    with open_repository(database_url) as repo:
        repo.append("live", [{"role": "user", "content": "hi"}])
    listing = CliRunner().invoke(main, ["--url", database_url, "sessions", "list", "--json"])
    assert listing.exit_code == 0, listing.output
    assert [s["status"] for s in json.loads(listing.stdout)["sessions"]] == ["open"]
