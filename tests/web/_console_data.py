"""The data the console's tests (and its README screenshots) look at: plain sessions to
list and page through, one rich transcript (tool calls and their outputs, an image,
reasoning, a continuation chain), a long transcript to page by ``seq``, and the XSS
corpus: hostile text in ids, titles, messages, tool calls and outputs, and metadata."""

from __future__ import annotations

import base64
import struct
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from sessionrepo import Message, SessionRepository

SOURCES: Final = ("discord", "telegram", "cli")
PLAIN: Final = 120  # sessions in the listing besides the special ones: 3 pages of 50
LONG: Final = "long-transcript"
LONG_MESSAGES: Final = 130
RICH: Final = "rich-debug-session"
RICH_PARENT: Final = "rich-debug-session-before-compression"
#: What the OpenAI Agents adapter stores: Responses-API items (a function call and its
#: output, reasoning with a summary, a provider-run web search, a message item).
AGENTS: Final = "agents-sdk-session"
XSS_SESSION: Final = 'xss"><script>window.__pwned=1</script>'
#: The phrase the search tests look for (in the rich session only).
NEEDLE: Final = "flaky migration"

#: Hostile strings: none may execute, change the page, or hide itself.
XSS: Final = (
    "<script>window.__pwned = 1; alert(1)</script>",
    '<img src=x onerror="window.__pwned=1">',
    '<svg onload="window.__pwned=1"><script>window.__pwned=1</script></svg>',
    '<a href="javascript:window.__pwned=1">click me</a>',
    "javascript:window.__pwned=1",
    '"><iframe src="javascript:window.__pwned=1"></iframe>',
    "<style>body { display: none !important }</style>",
    '<div style="background:url(javascript:window.__pwned=1)">styled</div>',
    "{{ 7*7 }} {% raw %} ${7*7} #{7*7}",
    "</pre></details></article><script>window.__pwned=1</script>",
    "<math><mtext><table><mglyph><style><img src=x onerror=window.__pwned=1>",
    "admin\u202egnp.exe",  # right-to-left override: must show as <U+202E>
    "zero\u200bwidth\u2066isolate\u2069",
    '<meta http-equiv="refresh" content="0;url=javascript:window.__pwned=1">',
    '<form action="https://example.invalid"><button>send</button></form>',
)


def png(width: int = 24, height: int = 16) -> str:
    """A real PNG (a gradient) as a data URL."""
    rows = b"".join(
        b"\x00" + bytes(v for x in range(width) for v in (x * 10 % 256, y * 15 % 256, 160))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    image = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(image).decode()


SVG_URL: Final = (
    "data:image/svg+xml;base64,"
    + base64.b64encode(
        b'<svg xmlns="http://www.w3.org/2000/svg" onload="window.__pwned=1"/>'
    ).decode()
)

START: Final = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def _at(minutes: float) -> datetime:
    return START + timedelta(minutes=minutes)


def seed(repository: SessionRepository) -> None:
    """Fill an empty store with the console's test data (about 700 messages)."""
    for number in range(PLAIN):
        sid = f"plain-{number:03d}"
        source = SOURCES[number % 3]
        repository.append(
            sid,
            [
                Message(
                    role="user", content=f"question {number} from {source}", timestamp=_at(number)
                ),
                Message(role="assistant", content=f"answer {number}", timestamp=_at(number + 0.5)),
            ],
            source=source,
            user_id="alice" if number % 2 else "bob",
            title=f"Plain conversation {number}",
        )
        repository.backdate_activity(sid, _at(number + 0.5), stamped_since=START)
        if number % 5 == 0:
            repository.end_session(sid, "user_left")

    repository.append(
        LONG,
        [
            Message(
                role="user" if i % 2 == 0 else "assistant",
                content=f"long message {i}",
                timestamp=_at(200 + i / 60),
            )
            for i in range(LONG_MESSAGES)
        ],
        source="cli",
        user_id="carol",
        title="A long transcript",
    )
    repository.backdate_activity(LONG, _at(205), stamped_since=START)
    _rich(repository)
    _agents(repository)
    _xss(repository)


def _rich(repository: SessionRepository) -> None:
    repository.append(
        RICH_PARENT,
        [
            Message(role="user", content="Our nightly deploy keeps failing.", timestamp=_at(290)),
            Message(
                role="assistant", content="Let us look at the pipeline logs.", timestamp=_at(291)
            ),
        ],
        source="telegram",
        user_id="dana",
        title="Nightly deploy (before compression)",
    )
    repository.end_session(RICH_PARENT, "compression")
    repository.backdate_activity(RICH_PARENT, _at(291), stamped_since=START)
    repository.append(
        RICH,
        [
            Message(role="system", content="You are the on-call assistant.", timestamp=_at(300)),
            Message(
                role="user",
                content=[
                    {"type": "text", "text": f"Here is the dashboard: the {NEEDLE} again?"},
                    {"type": "image_url", "image_url": {"url": png(160, 90)}},
                ],
                timestamp=_at(301),
            ),
            Message(
                role="assistant",
                content="I will check the deploy log and the migration status.",
                reasoning="The dashboard shows a red migration step; read the log first.",
                tool_calls=[
                    {
                        "id": "call_log",
                        "type": "function",
                        "function": {
                            "name": "read_log",
                            "arguments": '{"job": "deploy", "lines": 50}',
                        },
                    },
                    {
                        "id": "call_db",
                        "type": "function",
                        "function": {"name": "migration_status", "arguments": "{}"},
                    },
                ],
                timestamp=_at(302),
            ),
            Message(
                role="tool",
                tool_call_id="call_log",
                tool_name="read_log",
                content="ERROR step 4/7: migration 0042 timed out after 30s (lock wait)",
                timestamp=_at(302.5),
            ),
            Message(
                role="tool",
                tool_call_id="call_db",
                tool_name="migration_status",
                content='{"head": "0041", "pending": ["0042"]}',
                timestamp=_at(302.6),
            ),
            Message(
                role="assistant",
                content=(
                    f"It is the {NEEDLE}: 0042 waits for a lock held by the nightly report. "
                    "Run it after the report, or add lock_timeout."
                ),
                finish_reason="stop",
                token_count=61,
                timestamp=_at(303),
            ),
            Message(
                role="user",
                content=[
                    {
                        "type": "file",
                        "file": {"filename": "deploy.log", "file_data": "U0dWc2JHOD0="},
                    }
                ],
                timestamp=_at(304),
            ),
        ],
        source="telegram",
        user_id="dana",
        title="Nightly deploy fails at the migration step",
        model="gpt-4.1",
        parent_session_id=RICH_PARENT,
        metadata={"chat": "ops-room", "priority": "high"},
    )
    repository.backdate_activity(RICH, _at(304), stamped_since=START)


AGENT_ITEMS: Final[tuple[dict[str, Any], ...]] = (
    {"content": "What is the weather in Kyoto?", "role": "user"},
    {
        "id": "rs_01",
        "summary": [
            {"text": "The user wants Kyoto's weather: call the tool.", "type": "summary_text"}
        ],
        "type": "reasoning",
        "content": [{"text": "get_weather takes a city and a unit.", "type": "reasoning_text"}],
        "encrypted_content": "gAAAAABn-ENCRYPTED==",
    },
    {
        "arguments": '{"city": "Kyoto", "unit": "celsius"}',
        "call_id": "call_fn_01",
        "name": "get_weather",
        "type": "function_call",
        "id": "fc_01",
        "status": "completed",
    },
    {
        "id": "ws_01",
        "action": {"query": "Kyoto weather tomorrow", "type": "search"},
        "status": "completed",
        "type": "web_search_call",
    },
    {
        "output": '{"temperature": 21.5, "sky": "clear"}',
        "type": "function_call_output",
        "call_id": "call_fn_01",
    },
    {
        "id": "msg_01",
        "content": [
            {"annotations": [], "text": "21.5 °C and clear in Kyoto.", "type": "output_text"}
        ],
        "role": "assistant",
        "status": "completed",
        "type": "message",
    },
)


def _agents(repository: SessionRepository) -> None:
    repository.append(
        AGENTS,
        [Message.from_openai(item) for item in AGENT_ITEMS],
        source="openai-agents",
        user_id="erin",
        title="Weather in Kyoto (Agents SDK)",
    )
    repository.backdate_activity(AGENTS, _at(350), stamped_since=START)


def _xss(repository: SessionRepository) -> None:
    messages: list[Message | dict[str, Any]] = []
    for number, payload in enumerate(XSS):
        messages.append(
            Message(role="user", content=f"xss needle {payload}", timestamp=_at(400 + number))
        )
        messages.append(
            Message(
                role="assistant",
                content=[
                    {"type": "text", "text": payload},
                    {"type": "image_url", "image_url": {"url": payload}},
                ],
                tool_calls=[
                    {
                        "id": f"{payload}-{number}",
                        "type": "function",
                        "function": {"name": payload, "arguments": payload},
                    }
                ],
                reasoning=payload,
                extra={"name": payload},
                timestamp=_at(400 + number + 0.1),
            )
        )
        messages.append(
            Message(
                role="tool",
                tool_call_id=f"{payload}-{number}",
                tool_name=payload[:64],
                content=payload,
                timestamp=_at(400 + number + 0.2),
            )
        )
    for number, payload in enumerate(XSS):
        # Responses items whose type, call id, name and values are hostile.
        call_id = f"item-{number}-{payload}"
        kinds = (f"{payload}_call", f"{payload}_call_output", "reasoning")
        messages += [
            Message.from_openai(
                {"type": kinds[0], "call_id": call_id, "name": payload, "arguments": payload},
                timestamp=_at(415 + number / 60),
            ),
            Message.from_openai(
                {"type": kinds[1], "call_id": call_id, "output": payload},
                timestamp=_at(415 + number / 60),
            ),
            Message.from_openai(
                {"type": kinds[2], "summary": [{"type": "summary_text", "text": payload}]},
                timestamp=_at(415 + number / 60),
            ),
        ]
    messages.append(
        Message(
            role="user",
            content=[{"type": "image_url", "image_url": {"url": SVG_URL}}],
            timestamp=_at(420),
        )
    )
    repository.append(
        XSS_SESSION,
        messages,
        source="<script>window.__pwned=1</script>",
        user_id='"onmouseover="window.__pwned=1',
        title=XSS[0] + " " + XSS[11],
        model=XSS[1][:64],
        system_prompt=XSS[2],
        metadata={"<script>": XSS[0], "href": XSS[4]},
    )
    repository.backdate_activity(XSS_SESSION, _at(430), stamped_since=START)
