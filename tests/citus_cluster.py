"""A throwaway local Citus cluster: one coordinator and N workers, from an installed
``citus`` extension.

Each node is a private PostgreSQL server (``initdb`` in one temporary directory, a free
port on 127.0.0.1, trust authentication, ``shared_preload_libraries = 'citus'``), made
and run by :class:`tests._pgcluster.ThrowawayCluster` (as the ``postgres`` user through
``runuser`` when run as root). The coordinator knows its workers (``citus_add_node``);
the ``postgres`` database of every node has the extension. Nothing here builds or fetches
Citus: without the extension installed, :class:`CitusUnavailable` says so.

As a script (``python tests/citus_cluster.py`` or ``python -m tests.citus_cluster``)::

    start [--workers N] [--dir DIR] [--shards N]
                                      start a cluster, print the coordinator's URL; its
                                      state (pids, directories) is kept in DIR; N shards
                                      per table (default 4; 0: Citus's default, 32)
    stop --dir DIR                    stop the cluster started with that DIR, remove it
    run [--workers N] -- COMMAND...   run COMMAND with SESSIONREPO_TEST_CITUS_URL naming
                                      a cluster started for it (and
                                      SESSIONREPO_REQUIRE_CITUS=1), stop the cluster after
                                      it; with the variable set already, only run COMMAND
    available                         exit 0 when the extension is installed, else say
                                      why and exit 1

In tests, :func:`citus_cluster` is a context manager around the same class.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

try:  # pytest and `python tests/citus_cluster.py` put tests/ on sys.path
    from _pgcluster import ClusterUnavailable, ThrowawayCluster, find_bindir
except ImportError:  # `python -m tests.citus_cluster` from the project root
    from tests._pgcluster import ClusterUnavailable, ThrowawayCluster, find_bindir

#: Settings every node gets on top of the throwaway cluster's own.
NODE_SETTINGS = {
    "shared_preload_libraries": "'citus'",
    # The tests' pools and Citus's connections to the workers, on one machine.
    "max_connections": "400",
    "citus.max_client_connections": "-1",
}
#: Shards per distributed table in the tests: few, so a test schema distributes its
#: tables quickly (routing is the same). ``start --shards N`` sets another count; 0
#: keeps Citus's default (32), what ``sessionrepo migrate`` gets on a real cluster.
TEST_SHARDS = 4


class CitusUnavailable(Exception):
    """The PostgreSQL binaries or the ``citus`` extension are not installed."""


def extension_dir(bindir: Path) -> Path:
    """Where the server's extensions' control files are (``pg_config --sharedir``)."""
    pg_config = bindir / "pg_config"
    command = [str(pg_config)] if pg_config.is_file() else ["pg_config"]
    try:
        share = subprocess.run(
            [*command, "--sharedir"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise CitusUnavailable(f"pg_config --sharedir failed: {exc}") from exc
    return Path(share) / "extension"


def check_available() -> Path:
    """The PostgreSQL bindir whose server has the ``citus`` extension installed.

    Raises:
        CitusUnavailable: it has not (the message says where it looked).
    """
    try:
        bindir = find_bindir()
    except ClusterUnavailable as exc:
        raise CitusUnavailable(str(exc)) from exc
    control = extension_dir(bindir) / "citus.control"
    if not control.is_file():
        raise CitusUnavailable(
            f"the citus extension is not installed for the PostgreSQL in {bindir} (no {control})"
        )
    return bindir


class CitusCluster:
    """A coordinator and ``workers`` workers, started and joined; :meth:`destroy` ends them."""

    def __init__(self, workers: int = 2, shards: int = TEST_SHARDS) -> None:
        bindir = check_available()
        self.nodes: list[ThrowawayCluster] = []
        settings = dict(NODE_SETTINGS)
        if shards:
            settings["citus.shard_count"] = str(shards)
        try:
            for _ in range(1 + workers):
                node = ThrowawayCluster(bindir)
                with (node.data / "postgresql.conf").open("a") as conf:
                    conf.write("\n# sessionrepo citus tests\n")
                    conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
                self.nodes.append(node)
            for node in self.nodes:
                node.start()
                with node.admin() as conn:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
            with self.coordinator.admin() as conn:
                conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", [self.port])
                for worker in self.workers:
                    conn.execute("SELECT citus_add_node('127.0.0.1', %s)", [worker.port])
        except BaseException:
            self.destroy()
            raise

    @property
    def coordinator(self) -> ThrowawayCluster:
        return self.nodes[0]

    @property
    def workers(self) -> list[ThrowawayCluster]:
        return self.nodes[1:]

    @property
    def port(self) -> int:
        return self.coordinator.port

    @property
    def url(self) -> str:
        """The coordinator's ``postgres`` database: what gateways and tests connect to."""
        return self.coordinator.url

    def destroy(self) -> None:
        """Stop every node and remove its directory. Never raises."""
        for node in reversed(self.nodes):
            node.destroy()

    def leftover_pids(self) -> list[int]:
        return sorted(pid for node in self.nodes for pid in node.leftover_pids())


@contextlib.contextmanager
def citus_cluster(workers: int = 2) -> Iterator[CitusCluster]:
    cluster = CitusCluster(workers)
    try:
        yield cluster
    finally:
        cluster.destroy()


# -- the command line ------------------------------------------------------------------


def _state_file(directory: Path) -> Path:
    return directory / "cluster.json"


def _start(workers: int, directory: Path | None, shards: int = TEST_SHARDS) -> int:
    cluster = CitusCluster(workers, shards)
    where = directory or Path(tempfile.mkdtemp(prefix="sessionrepo-citus-"))
    where.mkdir(parents=True, exist_ok=True)
    state = {
        "url": cluster.url,
        "nodes": [
            {"root": str(node.root), "port": node.port, "bindir": str(node.bindir)}
            for node in cluster.nodes
        ],
    }
    _state_file(where).write_text(json.dumps(state, indent=2))
    print(cluster.url)
    print(
        f"state in {where}; stop: python tests/citus_cluster.py stop --dir {where}", file=sys.stderr
    )
    return 0


def _adopt(bindir: Path, root: Path, port: int) -> ThrowawayCluster:
    """The :class:`ThrowawayCluster` a ``start`` in another process made (for its
    ``destroy``), rebuilt from what ``start`` recorded."""
    node = ThrowawayCluster.__new__(ThrowawayCluster)
    node.bindir = bindir
    node.root = root
    node.data = root / "data"
    node.log = root / "server.log"
    node.port = port
    node.cluster_name = f"sessionrepo-outage-{port}"
    node._frozen = []
    node._template = None
    runuser = shutil.which("runuser")
    node._prefix = [runuser, "-u", "postgres", "--"] if os.geteuid() == 0 and runuser else []
    return node


def _stop(directory: Path) -> int:
    state = json.loads(_state_file(directory).read_text())
    for entry in reversed(state["nodes"]):
        _adopt(Path(entry["bindir"]), Path(entry["root"]), int(entry["port"])).destroy()
    shutil.rmtree(directory, ignore_errors=True)
    return 0


def _run(workers: int, command: list[str]) -> int:
    if not command:
        raise CitusUnavailable("run: no command given (run -- COMMAND...)")
    env = dict(os.environ, SESSIONREPO_REQUIRE_CITUS="1")
    if env.get("SESSIONREPO_TEST_CITUS_URL"):
        return subprocess.run(command, env=env, check=False).returncode
    started = time.monotonic()
    with citus_cluster(workers) as cluster:
        print(
            f"citus cluster: coordinator {cluster.url}, {workers} workers "
            f"(started in {time.monotonic() - started:.1f} s)",
            file=sys.stderr,
        )
        env["SESSIONREPO_TEST_CITUS_URL"] = cluster.url
        return subprocess.run(command, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start a cluster, print the coordinator's URL")
    start.add_argument("--workers", type=int, default=2)
    start.add_argument("--dir", type=Path, default=None)
    start.add_argument(
        "--shards", type=int, default=TEST_SHARDS, help="shards per table (0: Citus's 32)"
    )
    stop = commands.add_parser("stop", help="stop the cluster started with --dir DIR")
    stop.add_argument("--dir", type=Path, required=True)
    run = commands.add_parser("run", help="run a command against a cluster started for it")
    run.add_argument("--workers", type=int, default=2)
    run.add_argument("command_", metavar="COMMAND", nargs=argparse.REMAINDER)
    commands.add_parser("available", help="exit 0 when the citus extension is installed")
    args = parser.parse_args(argv)
    try:
        if args.command == "available":
            check_available()
            return 0
        if args.command == "start":
            return _start(args.workers, args.dir, args.shards)
        if args.command == "run":
            command = args.command_[1:] if args.command_[:1] == ["--"] else args.command_
            return _run(args.workers, command)
        return _stop(args.dir)
    except CitusUnavailable as exc:
        print(f"citus unavailable: {exc}", file=sys.stderr)
        return 1
    except (RuntimeError, psycopg.Error, OSError) as exc:
        print(f"citus cluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
