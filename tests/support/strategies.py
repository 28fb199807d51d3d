"""Hypothesis strategies (and a strict comparison) shared by the faithful-storage tests.

Everything generated here is *valid*: DESIGN.md promises that it round-trips exactly,
through ``Message.from_openai(d).to_openai()`` and through both backends.

- :func:`texts`: any valid Unicode string (every code point except lone surrogates:
  NUL, C0/C1 controls, DEL, BOM, noncharacters, astral planes), with extra weight on
  the characters the storage layer treats specially (U+FDD0 at the start, NUL).
- :func:`json_values`: JSON that round-trips (finite floats incl. ``-0.0`` and
  subnormals, ints up to 256 bits, nested lists and str-keyed dicts, bounded).
- :func:`openai_messages`: OpenAI chat-format message dicts with optional, absent and
  explicitly ``None`` fields, unknown extra keys, keys in random order.
- :func:`assert_identical`: ``==`` that also tells ``1`` from ``1.0`` from ``True``,
  ``0.0`` from ``-0.0``, and compares dict key order, recursively.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Final

from hypothesis import strategies as st

from sessionrepo.models import MAX_ID_LENGTH
from sessionrepo.models._limits import MAX_JSON_INT_BITS
from sessionrepo.models.message import KEY_FIELD, WIRE_FIELDS
from sessionrepo.models.tables import ENCODED_MARK

#: Characters the storage layer, a driver or a database could plausibly mishandle.
TRICKY_CHARACTERS: Final = (
    "\x00",  # NUL: PostgreSQL text cannot hold it
    "\x01",
    "\t",
    "\n",
    "\r",
    "\x1b",
    "\x1f",
    "\x7f",  # DEL
    "\x80",
    "\x85",  # NEL (C1)
    "\x9f",
    "\u00ad",  # soft hyphen
    "\u0301",  # combining acute accent
    "\u200b",  # zero width space
    "\u200d",  # zero width joiner
    "\u202e",  # right-to-left override
    "\u2028",  # line separator (not valid in some JSON readers)
    "\u2029",
    "\ufeff",  # BOM
    ENCODED_MARK,  # U+FDD0, the stored-as-JSON mark
    "\ufdef",
    "\ufffd",
    "\ufffe",
    "\uffff",
    "\U0001f600",
    "\U0001f469",
    "\U00010000",
    "\U000e0001",
    "\U0010fffe",
    "\U0010ffff",
    '"',
    "\\",
    "'",
)

_SURROGATES: Final[list[Any]] = ["Cs"]

#: Every code point except the surrogates (U+D800..U+DFFF), which no UTF-8 store holds.
_any_code_point = st.characters(codec=None, exclude_categories=_SURROGATES)
characters = st.one_of(
    _any_code_point, st.sampled_from(TRICKY_CHARACTERS), st.sampled_from(["\x00", ENCODED_MARK])
)

#: Printable identifier characters: no C0 or C1 control and no DEL (see ``check_identifier``).
identifier_characters = st.characters(
    min_codepoint=0x20,
    exclude_categories=_SURROGATES,
    exclude_characters="".join(map(chr, range(0x7F, 0xA0))),
)

MAX_JSON_INT: Final = 2**MAX_JSON_INT_BITS - 1

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

#: Keys a provider or a gateway may put on a message that the model does not name.
KNOWN_EXTRA_KEYS: Final = (
    "name",
    "refusal",
    "audio",
    "timestamp",
    "function_call",
    "annotations",
    "id",
    "created",
    "metadata",
    "extra",
    "openai_keys",
    "session_id",
    "seq",
    "",
)
RESERVED_KEYS: Final = frozenset((*WIRE_FIELDS, KEY_FIELD))

#: Fields that are printable identifiers when present.
IDENTIFIER_FIELDS: Final = ("tool_call_id", "tool_name", "finish_reason", "platform_message_id")


def texts(*, min_size: int = 0, max_size: int = 24) -> st.SearchStrategy[str]:
    """Any valid Unicode string, often starting with U+FDD0 (alone or before JSON)."""
    plain = st.text(characters, min_size=min_size, max_size=max_size)
    marked = plain.map(lambda s: ENCODED_MARK + s)
    # A string that *looks* stored-as-JSON must still come back as that string.
    json_looking = st.one_of(
        st.lists(st.integers() | plain, max_size=3),
        st.dictionaries(plain, plain | st.none(), max_size=2),
        plain,
        st.none(),
        st.booleans(),
    ).map(lambda value: ENCODED_MARK + json.dumps(value, ensure_ascii=False))
    return st.one_of(plain, plain, plain, marked, json_looking).filter(lambda s: len(s) >= min_size)


def identifiers() -> st.SearchStrategy[str]:
    """Printable identifiers, 1 to ``MAX_ID_LENGTH`` characters."""
    realistic = st.from_regex(r"[A-Za-z0-9_\-:.]{1,40}", fullmatch=True)
    arbitrary = st.text(identifier_characters, min_size=1, max_size=32)
    longest = arbitrary.map(lambda s: (s * MAX_ID_LENGTH)[:MAX_ID_LENGTH])
    return st.one_of(realistic, arbitrary, longest, st.sampled_from(["call_0", "é", "🙂"]))


def json_ints() -> st.SearchStrategy[int]:
    """Integers within the documented bound (``MAX_JSON_INT_BITS`` bits), edges included."""
    return st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70),
        st.integers(min_value=-MAX_JSON_INT, max_value=MAX_JSON_INT),
        st.sampled_from(
            [0, -1, 2**53 + 1, INT64_MAX, INT64_MIN, 2**64, -(2**64), MAX_JSON_INT, -MAX_JSON_INT]
        ),
    )


def json_floats() -> st.SearchStrategy[float]:
    """Finite floats, ``-0.0`` and subnormals included."""
    return st.one_of(
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from([0.0, -0.0, 0.1, 1.0, -1.0, 1e308, -1e308, 5e-324, -5e-324, 2.5e-308]),
    )


def json_scalars() -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), st.booleans(), json_ints(), json_floats(), texts())


def json_values(*, max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """JSON values that round-trip: bounded in size (and so in depth)."""
    return st.recursive(
        json_scalars(),
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(texts(max_size=8), children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def content_parts() -> st.SearchStrategy[dict[str, Any]]:
    """One part of a multimodal ``content`` list."""
    text_part = st.fixed_dictionaries({"type": st.just("text"), "text": texts()})
    url = st.one_of(
        st.sampled_from(["https://example.com/cat.png", "data:image/png;base64,iVBORw0KGgo="]),
        texts(min_size=1).map(lambda s: "https://example.com/" + s),
    )
    image_part = st.fixed_dictionaries(
        {
            "type": st.just("image_url"),
            "image_url": st.fixed_dictionaries(
                {"url": url}, optional={"detail": st.sampled_from(["auto", "low", "high"])}
            ),
        }
    )
    audio_part = st.fixed_dictionaries(
        {
            "type": st.just("input_audio"),
            "input_audio": st.fixed_dictionaries(
                {
                    "data": st.from_regex(r"[A-Za-z0-9+/]{0,16}={0,2}", fullmatch=True),
                    "format": st.sampled_from(["wav", "mp3"]),
                }
            ),
        }
    )
    other_part = st.dictionaries(texts(max_size=8), json_values(max_leaves=4), max_size=3)
    return st.one_of(text_part, image_part, audio_part, other_part)


def contents() -> st.SearchStrategy[Any]:
    """``content``: a string, a list of content parts, ``None``, now and then a dict."""
    return st.one_of(
        texts(max_size=64),
        st.lists(content_parts(), max_size=4),
        st.none(),
        st.dictionaries(texts(max_size=8), json_values(max_leaves=4), max_size=3),
    )


def tool_calls() -> st.SearchStrategy[list[Any]]:
    """``tool_calls``: OpenAI function calls (arguments as JSON text), or any JSON list."""
    call = st.fixed_dictionaries(
        {
            "id": identifiers(),
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {
                    "name": identifiers(),
                    "arguments": st.one_of(
                        json_values(max_leaves=6).map(lambda v: json.dumps(v, ensure_ascii=False)),
                        texts(),
                    ),
                }
            ),
        },
        optional={"index": st.integers(0, 16), "extra": json_values(max_leaves=4)},
    )
    return st.one_of(
        st.lists(call, max_size=3),
        st.lists(json_values(max_leaves=6), max_size=3),
    )


def extra_keys() -> st.SearchStrategy[str]:
    """Keys of a message dict that are not named fields (they go to ``extra``)."""
    return st.one_of(st.sampled_from(KNOWN_EXTRA_KEYS), texts(max_size=12)).filter(
        lambda key: key not in RESERVED_KEYS
    )


#: Marks a field that a generated message leaves out altogether.
_ABSENT: Final = object()


def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Absent, explicitly ``None``, or a value."""
    return st.one_of(st.just(_ABSENT), st.just(_ABSENT), st.none(), strategy)


def _field_strategies() -> dict[str, st.SearchStrategy[Any]]:
    """A strategy for every named field but ``role``."""
    fields: dict[str, st.SearchStrategy[Any]] = {
        "content": contents(),
        "tool_calls": tool_calls(),
        "reasoning": texts(max_size=48),
        "token_count": st.integers(min_value=INT64_MIN, max_value=INT64_MAX),
    }
    for name in IDENTIFIER_FIELDS:
        fields[name] = identifiers()
    return {name: _optional(strategy) for name, strategy in fields.items()}


ROLES: Final = ("system", "developer", "user", "assistant", "tool", "function")


# Built once: building strategies is what costs, not drawing from them.
_ROLE = st.sampled_from(ROLES)
_FIELDS = _field_strategies()
_EXTRA = st.dictionaries(extra_keys(), json_values(max_leaves=6), max_size=3)


#: Keys a Responses item may have that are our field names elsewhere: an item's own.
_ITEM_KEYS = st.sampled_from(
    (
        "reasoning",
        "tool_calls",
        "tool_call_id",
        "tool_name",
        "finish_reason",
        "token_count",
        "platform_message_id",
        "call_id",
        "arguments",
        "output",
        "summary",
        "id",
        "status",
    )
)


@st.composite
def openai_items(draw: st.DrawFn) -> dict[str, Any]:
    """An OpenAI Responses-API item without a role: a ``type``, maybe content, and keys
    of its own with arbitrary JSON (our field names included), in random order."""
    items: list[tuple[str, Any]] = [("type", draw(st.from_regex(r"[a-z_.]{1,24}", fullmatch=True)))]
    if draw(st.booleans()):
        items.append(
            ("content", draw(st.one_of(st.none(), texts(), st.lists(content_parts(), max_size=2))))
        )
    own = draw(
        st.dictionaries(st.one_of(_ITEM_KEYS, extra_keys()), json_values(max_leaves=4), max_size=3)
    )
    items += [(key, value) for key, value in own.items() if key not in ("type", "content", "role")]
    order = draw(st.permutations(range(len(items))))
    return {items[i][0]: items[i][1] for i in order}


def openai_messages() -> st.SearchStrategy[dict[str, Any]]:
    """An OpenAI-format dict without a ``client_msg_uuid``: mostly a chat-format message
    (:func:`chat_messages`), sometimes a Responses item without a role
    (:func:`openai_items`)."""
    return st.one_of(chat_messages(), chat_messages(), chat_messages(), openai_items())


@st.composite
def chat_messages(draw: st.DrawFn) -> dict[str, Any]:
    """An OpenAI chat-format message dict, without a ``client_msg_uuid``.

    ``role`` is always there; every other named field is absent, ``None`` or a value;
    up to three unknown keys carry arbitrary JSON; the keys come in random order.
    """
    items: list[tuple[str, Any]] = [("role", draw(_ROLE))]
    for name, strategy in _FIELDS.items():
        value = draw(strategy)
        if value is not _ABSENT:
            items.append((name, value))
    extra = draw(_EXTRA)
    items += extra.items()
    order = draw(st.permutations(range(len(items))))
    return {items[i][0]: items[i][1] for i in order}


def fixed_offsets() -> st.SearchStrategy[timezone]:
    """UTC and fixed offsets from -23:59 to +23:59, minute precision."""
    return st.one_of(
        st.just(UTC),
        st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
            lambda minutes: timezone(timedelta(minutes=minutes))
        ),
    )


def aware_datetimes() -> st.SearchStrategy[datetime]:
    """Timezone-aware datetimes (microseconds included) that exist in UTC too."""
    return st.datetimes(
        min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31), timezones=fixed_offsets()
    )


def timestamps() -> st.SearchStrategy[Any]:
    """What ``Message.timestamp`` accepts: aware datetimes and epoch seconds."""
    return st.one_of(
        aware_datetimes(),
        st.integers(min_value=0, max_value=2**34),
        st.floats(min_value=0, max_value=2**34, allow_nan=False, allow_infinity=False),
    )


def assert_identical(actual: Any, expected: Any, path: str = "$") -> None:
    """``actual == expected``, with exact types, float signs and dict key order.

    Plain ``==`` says ``1 == 1.0 == True``, ``0.0 == -0.0`` and ``{"a": 1, "b": 2} ==
    {"b": 2, "a": 1}``; faithful storage promises more than that.
    """
    assert type(actual) is type(expected), (
        f"{path}: {type(actual).__name__} {actual!r} != {type(expected).__name__} {expected!r}"
    )
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            assert_identical(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for index, (left, right) in enumerate(zip(actual, expected, strict=True)):
            assert_identical(left, right, f"{path}[{index}]")
    elif isinstance(expected, float):
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
        assert math.copysign(1.0, actual) == math.copysign(1.0, expected), (
            f"{path}: sign of {actual!r} != sign of {expected!r}"
        )
    elif isinstance(expected, datetime):
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
        assert actual.utcoffset() == expected.utcoffset(), f"{path}: offset differs"
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def nested_lists(depth: int) -> list[Any]:
    """``depth`` lists, each inside the previous one: ``[[[]]]`` for 3."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value
