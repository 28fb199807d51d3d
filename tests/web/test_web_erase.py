"""The console's erase action (behind ``--allow-writes``, confirmed, CSRF-checked) and
its audit page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from sessionrepo import open_repository

SECRET = "console-wombat-secret"


def test_the_console_erases_a_session_and_lists_it_in_the_audit(tmp_path: Path, serve: Any) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    repository = open_repository(url, auto_migrate=True)
    repository.append("sess-x", [{"role": "user", "content": SECRET}], user_id="u")
    repository.append("sess-y", [{"role": "user", "content": "stays"}], user_id="v")
    repository.close()

    read_only = serve(url)
    assert "/actions/erase" not in httpx.get(read_only.url("/session?id=sess-x")).text
    assert httpx.post(read_only.url("/actions/erase"), data={"id": "sess-x"}).status_code == 403
    read_only.stop()

    console = serve(url, "--allow-writes")
    page = httpx.get(console.url("/session?id=sess-x")).text
    assert "/actions/erase" in page
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match is not None
    csrf = match.group(1)
    unconfirmed = httpx.post(console.url("/actions/erase"), data={"id": "sess-x", "csrf": csrf})
    assert unconfirmed.status_code == 400
    assert (
        httpx.post(
            console.url("/actions/erase"), data={"id": "sess-x", "confirm": "yes"}
        ).status_code
        == 403
    )  # no form token
    done = httpx.post(
        console.url("/actions/erase"), data={"id": "sess-x", "csrf": csrf, "confirm": "yes"}
    )
    assert done.status_code == 303
    assert done.headers["location"] == "/audit?done=erased"
    audit = httpx.get(console.url("/audit?done=erased")).text
    assert "The session was erased" in audit
    assert audit.count('class="audit-entry"') == 1
    assert "console" in audit
    assert "sess-x" not in audit
    assert httpx.get(console.url("/session?id=sess-x")).status_code == 404
    assert SECRET not in httpx.get(console.url("/search?q=wombat")).text
    assert "sess-y" in httpx.get(console.url("/")).text
