"""The usage Hermes kept, as usage records (:class:`~sessionrepo.models.usage.Usage`).

Hermes keeps running totals, not one row per call: ``session_model_usage`` has one row
per session, model, provider (``billing_provider``, ``billing_base_url``,
``billing_mode``) and ``task`` (``''`` the main loop, ``vision``, ``compression``, … the
auxiliary calls), whose token counts, ``api_call_count`` and costs grow as the session
goes on. Older versions have no such table and keep the session's totals on its
``sessions`` row (``input_tokens``, ``output_tokens``, and later ``cache_read_tokens``,
``cache_write_tokens``, ``reasoning_tokens``, ``api_call_count``, ``estimated_cost_usd``,
``actual_cost_usd``, ``billing_provider``); Hermes' version-20 upgrade seeds one
``session_model_usage`` row from them (model, provider and task as below), so a session
with rows is read from its rows alone, never from both.

Each total becomes usage records whose sum is the total, imported once: a record's key
is derived from the row's key and the totals it brings the store to, and it holds what
those totals add to what the store already has of that row (``extra["hermes"]["row"]``
names the row). A re-import of the same totals finds the key stored and adds nothing; a
re-import after the session went on adds the difference, once. A total that shrank (the
row was reset) is reported, not subtracted. One record is not one call:
``extra["hermes"]["api_call_count"]`` says how many calls it sums.

``reported_cost`` is Hermes' ``actual_cost_usd`` (what the provider billed, when it was
above zero); its own estimate, ``estimated_cost_usd``, goes to ``extra["hermes"]`` with
``cost_status`` and ``cost_source``. The time of a record is the row's ``last_seen``,
else its ``first_seen``, else the session's end, else its start.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from sessionrepo.importers.hermes.keys import NAMESPACE
from sessionrepo.importers.hermes.source import USAGE_KEY_COLUMNS, epoch_seconds
from sessionrepo.models.usage import TOKEN_KINDS, Usage

#: The totals a row (or a session) carries besides its tokens.
_COUNTED: Final = ("api_call_count", "estimated_cost_usd", "actual_cost_usd")
#: Kept in ``extra["hermes"]`` as they are.
_KEPT: Final = ("billing_base_url", "billing_mode", "task", "cost_status", "cost_source")


def _number(value: Any) -> float:
    """A count or an amount as Hermes keeps it; anything else (text, a negative, an
    infinity: the session row keeps it aside) counts nothing."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return value if value > 0 and math.isfinite(value) else 0


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def row_key(values: Mapping[str, Any]) -> dict[str, str]:
    """What tells the row from the session's other rows (as Hermes' own key; the
    model ``unknown`` when it has none, as its version-20 upgrade names it)."""
    key = {name: _text(values.get(name)) for name in USAGE_KEY_COLUMNS}
    key["model"] = key["model"] or "unknown"
    return key


def totals(values: Mapping[str, Any]) -> dict[str, float]:
    """The running totals of a row (or a ``sessions`` row): tokens, calls, costs."""
    return {name: _number(values.get(name)) for name in (*TOKEN_KINDS, *_COUNTED)}


def from_session(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """A ``sessions`` row's totals as the one ``session_model_usage`` row Hermes'
    upgrade would make of them; ``None`` when it counts no token."""
    counted = totals(row)
    if not any(counted[kind] for kind in TOKEN_KINDS):
        return None
    values = {name: row.get(name) for name in USAGE_KEY_COLUMNS if name != "task"}
    values["model"] = row.get("model")
    values.update(counted)
    values["first_seen"] = row.get("started_at")
    values["last_seen"] = row.get("ended_at") or row.get("started_at")
    return values


def records(
    raw_session: Any,
    rows: Iterable[Mapping[str, Any]],
    stored: Iterable[Usage],
    *,
    session_time: float | None,
) -> tuple[list[Usage], list[str]]:
    """The records that bring the store's totals of each row up to Hermes' (nothing for
    a row the store is level with), and what was wrong with each row not brought up:
    its totals shrank, or a value the ledger cannot hold (e.g. a model name too long)."""
    have: dict[str, dict[str, float]] = {}
    for record in stored:
        kept = (record.extra or {}).get("hermes")
        if not isinstance(kept, dict) or not isinstance(kept.get("row"), dict):
            continue
        known = have.setdefault(_canonical(kept["row"]), dict.fromkeys(totals({}), 0))
        for kind in TOKEN_KINDS:
            known[kind] += getattr(record, kind)
        known["api_call_count"] += _number(kept.get("api_call_count"))
        known["estimated_cost_usd"] += _number(kept.get("estimated_cost_usd"))
        known["actual_cost_usd"] += record.reported_cost or 0.0
    made: list[Usage] = []
    problems: list[str] = []
    for key, now, values in _grouped(rows):
        canonical = _canonical(key)
        before = have.get(canonical, dict.fromkeys(now, 0))
        added = {name: now[name] - before[name] for name in now}
        if any(added[name] < 0 for name in (*TOKEN_KINDS, "api_call_count")):
            problems.append(
                f"session_model_usage {canonical}: its totals are below what an earlier "
                "import stored (the row was reset?): nothing subtracted"
            )
            continue
        if not any(added[kind] for kind in TOKEN_KINDS) and not added["api_call_count"]:
            continue
        have[canonical] = now
        when = (
            epoch_seconds(values.get("last_seen"))
            or epoch_seconds(values.get("first_seen"))
            or session_time
            or 0.0
        )
        hermes: dict[str, Any] = {"row": key}
        hermes.update({name: values[name] for name in _KEPT if values.get(name) is not None})
        hermes["api_call_count"] = int(added["api_call_count"])
        hermes["estimated_cost_usd"] = added["estimated_cost_usd"]
        state = json.dumps([canonical, sorted(now.items())], ensure_ascii=True)
        try:
            record = Usage(
                usage_id=uuid.uuid5(NAMESPACE, f"usage:{raw_session!r}:{state}"),
                model=key["model"],
                provider=key["billing_provider"] or None,
                **{kind: int(added[kind]) for kind in TOKEN_KINDS},
                reported_cost=added["actual_cost_usd"] or None,
                occurred_at=datetime.fromtimestamp(when, UTC),
                extra={"hermes": hermes},
            )
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            problems.append(f"session_model_usage {canonical}: {where}: {error['msg']}: not stored")
            continue
        made.append(record)
    return made, problems


def _grouped(
    rows: Iterable[Mapping[str, Any]],
) -> list[tuple[dict[str, str], dict[str, float], Mapping[str, Any]]]:
    """Each row key once, with its totals (summed, should a table without Hermes' key
    hold one twice) and its latest row's values."""
    grouped: dict[str, tuple[dict[str, str], dict[str, float], Mapping[str, Any]]] = {}
    for values in rows:
        key = row_key(values)
        counted = totals(values)
        canonical = _canonical(key)
        if canonical in grouped:
            _, before, _ = grouped[canonical]
            counted = {name: before[name] + counted[name] for name in counted}
        grouped[canonical] = (key, counted, values)
    return list(grouped.values())


def _canonical(key: Mapping[str, Any]) -> str:
    return json.dumps(dict(sorted(key.items())), ensure_ascii=True)
