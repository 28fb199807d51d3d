"""What ``sessionrepo doctor`` reads of a Citus coordinator: PostgreSQL's settings, the
workers and how each table is distributed."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection

from sessionrepo.dialects.citus.distribution import ANCHOR, plan, schema_tables
from sessionrepo.dialects.postgresql.probes import PostgresProbes
from sessionrepo.models.doctor import Check


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
