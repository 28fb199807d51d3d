"""``open_repository(..., tenant=NAME)`` on both backends, the operator acting as a tenant,
an outbox file bound to its tenant, and ``sessionrepo tenants`` (issue 28)."""

from __future__ import annotations

import asyncio
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy.engine import make_url

from sessionrepo import RepoError, TenantMismatch, open_async_repository, open_repository
from sessionrepo.cli import main
from sessionrepo.ops.tenants import create_tenant
from sessionrepo.outbox.writer import TranscriptWriter
from tests.conftest import PostgresServer


def test_a_sqlite_file_is_the_tenant_it_was_first_opened_for(tmp_path: Path) -> None:
    path = str(tmp_path / "gw.db")
    with open_repository(path, tenant="discord") as repo:
        repo.append("s", [{"role": "user", "content": "hi"}])
    with open_repository(path, tenant="discord") as repo:
        assert repo.get_session("s").message_count == 1
    with pytest.raises(TenantMismatch, match="tenant 'discord'"):
        open_repository(path, tenant="telegram")
    with open_repository(path) as repo:  # no tenant named: whoever the file is
        assert repo.get_session("s").message_count == 1


def test_a_file_with_sessions_and_no_tenant_is_the_default_tenants(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    with open_repository(path) as repo:
        repo.append("s", [{"role": "user", "content": "hi"}])
    with pytest.raises(TenantMismatch, match="'default'"):
        open_repository(path, tenant="discord")
    with open_repository(path, tenant="default") as repo:
        assert repo.get_session("s").message_count == 1


def test_the_async_api_checks_the_tenant_on_its_first_call(tmp_path: Path) -> None:
    path = str(tmp_path / "gw.db")
    open_repository(path, tenant="discord").close()

    async def main() -> None:
        repo = await open_async_repository(path, tenant="telegram")
        try:
            await repo.append("s", [{"role": "user", "content": "hi"}])
        finally:
            await repo.close()

    with pytest.raises(TenantMismatch):
        asyncio.run(main())


def test_a_tenant_name_is_checked_before_anything_opens(tmp_path: Path) -> None:
    for bad in ("Discord", "1abc", "a-b", "x" * 64, ""):
        with pytest.raises(RepoError):
            open_repository(str(tmp_path / "x.db"), tenant=bad)
    assert not (tmp_path / "x.db").exists()


@pytest.fixture
def pg_store(postgres_server: PostgresServer) -> Iterator[tuple[str, str, str, str]]:
    """An admin URL and two tenants' URLs and an operator's, on a fresh database."""
    name = postgres_server.new_database()
    admin = postgres_server.url_for(name)
    tag = uuid.uuid4().hex[:8]
    roles = (f"ta_{tag}", f"tb_{tag}", f"op_{tag}")
    urls = [
        create_tenant(
            admin, role, password=False, operator=role.startswith("op_")
        ).url.render_as_string(hide_password=False)
        for role in roles
    ]
    yield admin, *urls  # type: ignore[misc]
    postgres_server.drop(name)
    with psycopg.connect(_conninfo(postgres_server.url_for("postgres")), autocommit=True) as conn:
        for role in roles:
            conn.execute(f"DROP ROLE IF EXISTS {role}")  # type: ignore[arg-type]


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _role(url: str) -> str:
    return str(make_url(url).username)


@pytest.mark.postgres
def test_a_tenant_role_is_refused_another_tenant(pg_store: tuple[str, str, str, str]) -> None:
    _, a, b, _ = pg_store
    with open_repository(a, tenant=_role(a)) as repo:
        repo.append("s", [{"role": "user", "content": "A"}])
    with pytest.raises(TenantMismatch, match="may not act as the tenant"):
        open_repository(a, tenant=_role(b))


@pytest.mark.postgres
def test_the_operator_sees_every_tenant_and_acts_as_one(
    pg_store: tuple[str, str, str, str],
) -> None:
    _, a, b, operator = pg_store
    for url, text in ((a, "A"), (b, "B")):
        with open_repository(url) as repo:
            repo.append("discord:1", [{"role": "user", "content": text}])
    with open_repository(operator, tenant=_role(b)) as as_b:
        assert [m.content for m in as_b.load_transcript("discord:1")] == ["B"]
        as_b.append("discord:1", [{"role": "assistant", "content": "B2"}])
    with open_repository(b) as repo:  # written as B: B's own row
        assert [m.content for m in repo.load_transcript("discord:1")] == ["B", "B2"]
    with psycopg.connect(_conninfo(operator)) as conn:
        tenants = conn.execute("SELECT DISTINCT tenant FROM sessions ORDER BY 1").fetchall()
    assert [t for (t,) in tenants] == sorted([_role(a), _role(b)])


@pytest.mark.postgres
def test_an_outbox_file_is_drained_only_into_its_own_tenant(
    pg_store: tuple[str, str, str, str], tmp_path: Path
) -> None:
    _, a, b, _ = pg_store
    outbox = tmp_path / "outbox.db"
    # Bound by the tenant the repository was opened for (a URL alone binds nothing).
    repo = open_repository(a, tenant=_role(a))
    writer = TranscriptWriter(repo, outbox_url=str(outbox))
    writer.close()
    repo.close()
    other = open_repository(b, tenant=_role(b))
    try:
        with pytest.raises(TenantMismatch, match=_role(a)):
            TranscriptWriter(other, outbox_url=str(outbox))
    finally:
        other.close()


@pytest.mark.postgres
def test_the_tenants_commands(postgres_server: PostgresServer, tmp_path: Path) -> None:
    name = postgres_server.new_database()
    admin = postgres_server.url_for(name)
    role = f"tc_{uuid.uuid4().hex[:8]}"
    runner = CliRunner()
    url_file = tmp_path / "gw.url"
    try:
        made = runner.invoke(
            main, ["--url", admin, "tenants", "create", role, "--url-file", str(url_file)]
        )
        assert made.exit_code == 0, made.output
        url = url_file.read_text().strip()
        password = make_url(url).password
        assert password
        assert password not in made.output  # never printed
        assert f"{role}:***@" in made.output
        assert stat.S_IMODE(url_file.stat().st_mode) == 0o600
        again = runner.invoke(
            main, ["--url", admin, "tenants", "create", role, "--url-file", str(url_file)]
        )
        assert again.exit_code != 0  # the file exists: nothing is made
        listed = runner.invoke(main, ["--url", admin, "tenants", "list", "--json"])
        assert role in listed.output
        assert '"sessions": 0' in listed.output
        dropped = runner.invoke(main, ["--url", admin, "tenants", "drop", role])
        assert dropped.exit_code == 0, dropped.output
        assert runner.invoke(main, ["--url", admin, "tenants", "list"]).output.strip() == ""
    finally:
        postgres_server.drop(name)
        with psycopg.connect(_conninfo(postgres_server.url_for("postgres")), autocommit=True) as c:
            c.execute(f"DROP ROLE IF EXISTS {role}")  # type: ignore[arg-type]
