"""What ``sessionrepo doctor`` reads of a Citus coordinator: PostgreSQL's settings, every
worker's durability settings and versions, and how each table is distributed."""

from __future__ import annotations

import json
from typing import Any, Final

from sqlalchemy import Connection

from sessionrepo.dialects.citus.distribution import ANCHOR, plan, schema_tables
from sessionrepo.dialects.postgresql.probes import PostgresProbes
from sessionrepo.models.doctor import Check

#: The settings a commit's durability depends on, on every node, and the value each
#: must not have (``full_page_writes`` off is a warning, as on the coordinator).
_NODE_DURABILITY: Final = ("fsync", "synchronous_commit", "full_page_writes")


#: What each worker is asked (one JSON text).
_NODE_SETTINGS: Final = (
    "SELECT json_build_object("
    + ", ".join(f"'{name}', current_setting('{name}')" for name in _NODE_DURABILITY)
    + ", 'server_version_num', current_setting('server_version_num'), "
    "'citus_version', (SELECT extversion FROM pg_extension WHERE extname = 'citus'), "
    "'in_recovery', pg_is_in_recovery()::text)::text"
)


class CitusProbes(PostgresProbes):
    """PostgreSQL's checks, the workers and the distribution."""

    def settings(self, connection: Connection) -> dict[str, str]:
        settings = super().settings(connection)
        settings["citus_version"] = str(
            connection.exec_driver_sql(
                "SELECT extversion FROM pg_extension WHERE extname = 'citus'"
            ).scalar()
        )
        settings["citus_workers"] = json.dumps(
            [
                f"{host}:{port}"
                for host, port in connection.exec_driver_sql(
                    "SELECT node_name, node_port FROM citus_get_active_worker_nodes() "
                    "ORDER BY node_name, node_port"
                )
            ]
        )
        tables = connection.exec_driver_sql(
            "SELECT c.relname, p.partmethod, "
            "coalesce(column_to_column_name(p.logicalrelid, p.partkey), ''), "
            "(SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid), "
            "p.colocationid "
            "FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid "
            "WHERE c.relnamespace = current_schema()::regnamespace ORDER BY c.relname"
        )
        settings["citus_tables"] = json.dumps(
            {
                name: {"method": method, "column": column, "shards": shards, "group": group}
                for name, method, column, shards, group in tables
            }
        )
        settings["citus_expected"] = json.dumps(dict(plan(schema_tables(connection))))
        # Each worker as this role sees it there (a role's or database's setting of
        # synchronous_commit on a worker is what the coordinator's connections get).
        nodes: dict[str, dict[str, str]] = {}
        for host, port, success, result in connection.exec_driver_sql(
            f"SELECT nodename, nodeport, success, result FROM run_command_on_workers($$"
            f"{_NODE_SETTINGS}$$) ORDER BY nodename, nodeport"
        ):
            where = f"{host}:{port}"
            nodes[where] = json.loads(result) if success else {"error": str(result)[:300]}
        settings["citus_nodes"] = json.dumps(nodes)
        return settings

    def judge_settings(self, settings: dict[str, str]) -> list[Check]:
        checks = super().judge_settings(settings)
        workers: list[str] = json.loads(settings["citus_workers"])
        tables: dict[str, dict[str, Any]] = json.loads(settings["citus_tables"])
        expected: dict[str, str | None] = json.loads(settings["citus_expected"])
        checks.append(
            Check(
                name="citus.workers",
                status="ok" if workers else "fail",
                detail=f"Citus {settings['citus_version']}, {len(workers)} active workers"
                + (f" ({', '.join(workers)})" if workers else ""),
                fix=None if workers else "add workers: SELECT citus_add_node(host, port)",
            )
        )
        checks += _judge_nodes(settings, json.loads(settings["citus_nodes"]))
        anchor = tables.get(ANCHOR[0], {})
        wrong = []
        for name, column in expected.items():
            found = tables.get(name)
            if found is None:
                wrong.append(f"{name}: not distributed")
            elif column is None and found["method"] != "n":
                wrong.append(f"{name}: should be a reference table")
            elif column is not None and (
                found["method"] != "h"
                or found["column"] != column
                or found["group"] != anchor.get("group")
            ):
                wrong.append(f"{name}: should be distributed by {column}, co-located with sessions")
        distributed = sorted(n for n, c in expected.items() if c is not None and n in tables)
        reference = sorted(n for n, c in expected.items() if c is None and n in tables)
        detail = (
            f"distributed by session id ({anchor.get('shards', 0)} shards, co-located): "
            f"{', '.join(distributed) or 'none'}; reference: {', '.join(reference) or 'none'}"
        )
        checks.append(
            Check(name="citus.distribution", status="ok", detail=detail)
            if not wrong
            else Check(
                name="citus.distribution",
                status="fail",
                detail="; ".join(wrong),
                fix="run `sessionrepo migrate` on the coordinator (it distributes the schema)",
            )
        )
        return checks


def _judge_nodes(settings: dict[str, str], nodes: dict[str, dict[str, str]]) -> list[Check]:
    """Every worker's durability and versions, against the coordinator's."""
    unsafe: list[str] = []
    risky: list[str] = []
    versions: list[str] = []
    unreachable: list[str] = []
    major = int(settings["server_version_num"]) // 10_000
    for where, node in nodes.items():
        if "error" in node:
            unreachable.append(f"{where}: {node['error']}")
            continue
        unsafe += [
            f"{where}: {name} = off"
            for name in ("fsync", "synchronous_commit")
            if node[name] == "off"
        ]
        if node["full_page_writes"] == "off":
            risky.append(f"{where}: full_page_writes = off")
        if node["in_recovery"] == "true":
            unsafe.append(f"{where}: in recovery (a standby)")
        node_major = int(node["server_version_num"]) // 10_000
        if node["citus_version"] != settings["citus_version"] or node_major != major:
            versions.append(f"{where}: PostgreSQL {node_major}, Citus {node['citus_version']}")
    return [
        Check(
            name="citus.worker_durability",
            status="fail" if unsafe or unreachable else "warn" if risky else "ok",
            detail="; ".join([*unsafe, *risky, *unreachable])
            or f"{len(nodes)} workers: fsync, synchronous_commit and full_page_writes on",
            fix=None
            if not (unsafe or unreachable or risky)
            else "on each worker named: set fsync = on and synchronous_commit = on (and "
            "full_page_writes = on); bring an unreachable worker back",
        ),
        Check(
            name="citus.worker_versions",
            status="fail" if versions else "ok",
            detail="; ".join(versions)
            or f"every worker: PostgreSQL {major}, Citus {settings['citus_version']}",
            fix="run the coordinator's PostgreSQL major version and Citus version on every "
            "worker (ALTER EXTENSION citus UPDATE)"
            if versions
            else None,
        ),
    ]
