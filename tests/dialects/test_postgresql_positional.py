"""The one-call statements go to psycopg in the server's ``$n`` form, converted once
(psycopg itself parses the placeholders of a text past 4,096 bytes at every call)."""

from __future__ import annotations

from sessionrepo.dialects.postgresql.append import (
    _PG_APPEND_DIRECT,
    _PG_INSERT_NEW,
    _positional,
)


def test_a_name_used_twice_is_one_parameter_and_a_doubled_percent_one_sign() -> None:
    sql, names = _positional("SELECT %(a)s::text[], %(b)b, %(a)s WHERE x LIKE 'p%%' AND y = %(c)s")
    assert sql == "SELECT $1::text[], $2, $1 WHERE x LIKE 'p%' AND y = $3"
    assert names == ("a", "b", "c")


def test_the_append_statements_keep_no_placeholder_of_psycopg() -> None:
    for statement in (_PG_APPEND_DIRECT, _PG_INSERT_NEW):
        sql, names = _positional(statement)
        assert "%(" not in sql
        assert len(names) == len(set(names))
        assert f"${len(names)}" in sql


def test_the_conversion_is_made_once() -> None:
    assert _positional(_PG_APPEND_DIRECT) is _positional(_PG_APPEND_DIRECT)
