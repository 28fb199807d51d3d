"""A throwaway PostgreSQL cluster for crash and outage tests.

``initdb`` makes a private cluster in a temporary directory, on a free port, with trust
authentication and durable commits (``fsync=on``, ``synchronous_commit=on``). The tests
may then stop it (``-m immediate`` is a crash), start it again, freeze it (``SIGSTOP``)
and terminate its backends without touching the machine's shared server.

The binaries come from ``pg_config --bindir`` (else ``/usr/lib/postgresql/*/bin``). They
refuse to run as root, so under root they run as the ``postgres`` user through
``runuser``; as any other user they run directly. Without them the tests are skipped with
the reason shown, unless ``SESSIONREPO_REQUIRE_POSTGRES=1`` (CI), which fails instead.

Whatever happens, :meth:`ThrowawayCluster.destroy` thaws what was frozen, stops the
server, kills (by pid) any of the cluster's processes still alive, and removes the
directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import psycopg
import pytest

from sessionrepo.store.database import Database
from sessionrepo.store.schema import upgrade

#: Seconds ``pg_ctl`` may take to start or stop the server (crash recovery included).
PG_CTL_TIMEOUT = 60
#: Connections each test may open: 10 writer processes with their pools, plus drains.
MAX_CONNECTIONS = 300

SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": str(MAX_CONNECTIONS),
    "shared_buffers": "'32MB'",
    # Durable commits, as in production: an acknowledged write survives -m immediate.
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "logging_collector": "off",
    "log_min_messages": "warning",
    "log_line_prefix": "'%m [%p] %d '",
    "timezone": "'UTC'",
}


class ClusterUnavailable(Exception):
    """The PostgreSQL binaries (or the user to run them as) are not there."""


def find_bindir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` live: ``SESSIONREPO_PG_BINDIR`` if set, else
    ``pg_config --bindir``, else the newest ``/usr/lib/postgresql/*/bin``."""
    override = os.environ.get("SESSIONREPO_PG_BINDIR")
    if override:
        candidates = [override]
        where = f"SESSIONREPO_PG_BINDIR={override} does not have them"
    else:
        candidates = [
            *_pg_config_bindir(),
            *sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_major_version, reverse=True),
        ]
        where = "neither `pg_config --bindir` nor /usr/lib/postgresql/*/bin has them"
    for candidate in candidates:
        path = Path(candidate)
        if (path / "initdb").is_file() and (path / "pg_ctl").is_file():
            return path
    raise ClusterUnavailable(f"the PostgreSQL server binaries (initdb, pg_ctl): {where}")


def _pg_config_bindir() -> list[str]:
    try:
        found = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return []
    return [found] if found else []


def _major_version(bindir: str) -> int:
    name = Path(bindir).parent.name
    return int(name) if name.isdigit() else 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _children_of(parent: int) -> list[int]:
    """Direct children of ``parent`` (every PostgreSQL process is the postmaster's)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name (field 2) is parenthesised and may contain spaces.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == parent:
            children.append(int(entry))
    return children


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


class ThrowawayCluster:
    """A private PostgreSQL server: ``initdb`` on construction, ``destroy()`` at the end."""

    def __init__(self, bindir: Path | None = None) -> None:
        self.bindir = bindir or find_bindir()
        self._prefix: list[str] = []
        owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise ClusterUnavailable(
                    "running as root, and there is no `postgres` user to run initdb as"
                ) from None
            runuser = shutil.which("runuser")
            if runuser is None:
                raise ClusterUnavailable("running as root, and `runuser` is not available")
            self._prefix = [runuser, "-u", owner.pw_name, "--"]
        self.root = Path(tempfile.mkdtemp(prefix="sessionrepo-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.cluster_name = f"sessionrepo-outage-{self.port}"
        self._frozen: list[int] = []
        self._template: str | None = None
        try:
            if owner is not None:
                os.chown(self.root, owner.pw_uid, owner.pw_gid)
            os.chmod(self.root, 0o700)
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",  # the cluster is thrown away; its commits are durable
            )
            settings = dict(SETTINGS, port=str(self.port))
            settings["unix_socket_directories"] = f"'{self.root}'"
            # Every process of the cluster shows this in its command line: how teardown
            # tells ours from the machine's shared server.
            settings["cluster_name"] = f"'{self.cluster_name}'"
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write("\n# sessionrepo outage tests\n")
                conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    # -- addresses --------------------------------------------------------------------

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def conninfo(self, database: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def admin(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        """An autocommit connection for fault injection (the caller closes it)."""
        return psycopg.connect(
            self.conninfo(database),
            autocommit=True,
            connect_timeout=5,
            application_name="outage-admin",
        )

    # -- server life ------------------------------------------------------------------

    def _run(self, tool: str, *args: str) -> str:
        command = [*self._prefix, str(self.bindir / tool), *args]
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PG_CTL_TIMEOUT + 30,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
                f"\n--- server log ---\n{self.server_log()}"
            )
        return done.stdout

    def server_log(self, tail: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-tail:])
        except OSError:
            return "(no server log)"

    def start(self) -> None:
        """Start the server and wait until it accepts connections (recovery included)."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w",
            "-t", str(PG_CTL_TIMEOUT), "start",
        )  # fmt: skip

    def stop(self, mode: Literal["immediate", "fast", "smart"] = "immediate") -> None:
        """Stop the server. ``immediate`` is a crash: no checkpoint, recovery on start."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w",
                  "-t", str(PG_CTL_TIMEOUT), "stop")  # fmt: skip

    def restart(self, mode: Literal["immediate", "fast", "smart"] = "immediate") -> None:
        self.stop(mode)
        self.start()

    def is_running(self) -> bool:
        pid = self._pid_from_file()
        return pid is not None and pid in self.leftover_pids()

    def _pid_from_file(self) -> int | None:
        try:
            first = (self.data / "postmaster.pid").read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        return int(first) if first.strip().isdigit() else None

    def postmaster_pid(self) -> int:
        pid = self._pid_from_file()
        if pid is None:
            raise RuntimeError("the throwaway cluster is not running")
        return pid

    def server_pids(self) -> list[int]:
        """The postmaster and every process it started (backends, checkpointer, …)."""
        postmaster = self.postmaster_pid()
        return [postmaster, *_children_of(postmaster)]

    # -- faults -----------------------------------------------------------------------

    def freeze(self, *pids: int) -> list[int]:
        """``SIGSTOP`` the given processes, or, with none given, the whole server (the
        postmaster first, so that it starts nothing new, then all its children).

        Returns:
            The pids frozen now; :meth:`thaw` continues every frozen process.
        """
        if pids:
            targets = list(pids)
        else:
            postmaster = self.postmaster_pid()
            os.kill(postmaster, signal.SIGSTOP)
            self._frozen.append(postmaster)
            targets = _children_of(postmaster)
        for pid in targets:
            os.kill(pid, signal.SIGSTOP)
            self._frozen.append(pid)
        return targets if pids else [postmaster, *targets]

    def thaw(self) -> None:
        """``SIGCONT`` everything :meth:`freeze` stopped."""
        frozen, self._frozen = self._frozen, []
        for pid in reversed(frozen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def backend_pids(self, database: str | None = None) -> list[int]:
        """Client backends (the applications' connections), admin connections excluded."""
        query = (
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND pid <> pg_backend_pid() AND application_name <> 'outage-admin'"
        )
        params: list[object] = []
        if database is not None:
            query += " AND datname = %s"
            params.append(database)
        with self.admin() as conn:
            return [int(str(row[0])) for row in conn.execute(query, params)]

    def terminate_backends(self, database: str | None = None) -> int:
        """``pg_terminate_backend`` every application backend (of ``database``, if
        given), waiting until each has exited. Returns how many were terminated."""
        query = (
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) "
            "FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND pid <> pg_backend_pid() AND application_name <> 'outage-admin'"
        )
        params: list[object] = []
        if database is not None:
            query += " AND datname = %s"
            params.append(database)
        with self.admin() as conn:
            row = conn.execute(query, params).fetchone()
        return int(str(row[0])) if row else 0

    # -- databases --------------------------------------------------------------------

    def migrate(self, database: str = "postgres") -> None:
        db = Database(self.url_for(database))
        try:
            upgrade(db)
        finally:
            db.dispose()

    def create_database(self, template: str | None = None) -> str:
        """A new database (a copy of ``template`` if given); returns its name."""
        name = f"outage_{uuid.uuid4().hex[:10]}"
        clause = f' TEMPLATE "{template}"' if template else ""
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"{clause}')
        return name

    def fresh_database(self) -> str:
        """A new database at the schema's head (a copy of a template migrated once by
        ``repo.schema.upgrade``); returns its name (see :meth:`url_for`)."""
        if self._template is None:
            template = self.create_database()
            self.migrate(template)
            self._template = template
        return self.create_database(template=self._template)

    # -- teardown ---------------------------------------------------------------------

    def leftover_pids(self) -> list[int]:
        """Processes of this cluster still alive (the check after :meth:`destroy`).

        Found by command line: the postmaster's names our data directory, its
        children's our ``cluster_name``, so the machine's shared server never matches.
        """
        markers = (str(self.data).encode(), f"{self.cluster_name}:".encode())
        alive = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if any(marker in cmdline for marker in markers) and _alive(int(entry)):
                alive.append(int(entry))
        return sorted(alive)

    def destroy(self) -> None:
        """Thaw, stop, kill stragglers (by pid), remove the directory. Never raises."""
        self.thaw()
        if self.is_running():
            with contextlib.suppress(Exception):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w",
                          "-t", "30", "stop")  # fmt: skip
        for pid in self.leftover_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 10
        while self.leftover_pids() and time.monotonic() < end:
            time.sleep(0.05)
        shutil.rmtree(self.root, ignore_errors=True)


def _require_postgres() -> bool:
    return os.environ.get("SESSIONREPO_REQUIRE_POSTGRES") == "1"


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[ThrowawayCluster]:
    """A started cluster whose ``postgres`` database is migrated; destroyed on exit.

    Skips (or, with ``SESSIONREPO_REQUIRE_POSTGRES=1``, fails) when the binaries are
    missing.
    """
    try:
        cluster = ThrowawayCluster()
    except ClusterUnavailable as exc:
        reason = f"outage tests need a throwaway PostgreSQL cluster: {exc}"
        if _require_postgres():
            pytest.fail(f"SESSIONREPO_REQUIRE_POSTGRES=1 but: {reason}")
        pytest.skip(reason)
    try:
        cluster.start()
        cluster.migrate("postgres")
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[ThrowawayCluster]:
    """The module's throwaway cluster (see :func:`throwaway_cluster`)."""
    with throwaway_cluster() as cluster:
        yield cluster
    leftovers = cluster.leftover_pids()
    assert leftovers == [], f"the throwaway cluster left processes behind: {leftovers}"
