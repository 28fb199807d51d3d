"""``sessionrepo sessions rewind / clear / fork`` and ``show --include-retracted``."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

from sessionrepo import Message, open_repository
from sessionrepo.cli import main


def _run(url: str, *args: str) -> Result:
    return CliRunner().invoke(
        main, ["--url", url, "sessions", *args], env={"SESSIONREPO_DATABASE_URL": None}
    )


def test_rewind_fork_and_clear_from_the_command_line(database_url: str) -> None:
    repo = open_repository(database_url, auto_migrate=True)
    try:
        repo.append("s", [Message(role="user", content=f"turn {i}") for i in range(1, 6)])
        rewound = _run(database_url, "rewind", "s", "--to-seq", "3")
        assert rewound.exit_code == 0, rewound.output
        assert "2 messages rewound" in rewound.stdout
        assert "nothing changed" in _run(database_url, "rewind", "s", "--to-seq", "3").stdout
        assert [m.content for m in repo.load_transcript("s")] == ["turn 1", "turn 2", "turn 3"]

        shown = _run(database_url, "show", "s", "--include-retracted", "--json")
        records = [json.loads(line) for line in shown.stdout.splitlines()]
        assert [r["superseded"] for r in records] == [None] * 3 + ["retracted"] * 2

        forked = _run(database_url, "fork", "s", "--at-seq", "2", "--new-id", "f", "--json")
        assert forked.exit_code == 0, forked.output
        assert json.loads(forked.stdout)["forked_from_session_id"] == "s"
        assert [m.content for m in repo.load_transcript("f")] == ["turn 1", "turn 2"]

        cleared = _run(database_url, "clear", "s", "--json")
        assert json.loads(cleared.stdout)["message_count"] == 0
        assert repo.load_transcript("s") == []

        missing = _run(database_url, "clear", "nobody")
        assert missing.exit_code == 1
        assert missing.stderr.startswith("Error: ")
    finally:
        repo.close()
