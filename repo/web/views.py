"""What each console page shows, as plain data: built from the repository's own calls
(keyset listing, ``seq`` paging, search) and rendered twice, by the HTML templates and by
the JSON API, so that the two never disagree.

Everything here treats stored data as hostile: it is never turned into markup (the
templates escape it), an image is shown only as a raster ``data:`` URL that has been
checked, and invisible or direction-changing characters are made visible.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from sessionrepo.errors import InvalidArgument, RepoError
from sessionrepo.models import SearchHit, Session, SessionSummary, StoredMessage
from sessionrepo.models.outbox import OutboxStatus
from sessionrepo.models.transcript import CLIENT_CALL_TYPES, answered_call
from sessionrepo.ops import DoctorReport
from sessionrepo.ops.insights import InsightsRow, insights
from sessionrepo.search.query import parse_query
from sessionrepo.search.text import words
from sessionrepo.store.repository import SessionRepository
from sessionrepo.web.charts import bar_chart

#: Messages per transcript page, sessions per listing page, hits per search page.
TRANSCRIPT_PAGE: Final = 100
LISTING_PAGE: Final = 50
SEARCH_PAGE: Final = 20
#: Characters of one text shown on a page; the export has the rest.
TEXT_LIMIT: Final = 20_000
#: Characters of a JSON value (tool arguments, metadata, an unknown part) shown.
JSON_LIMIT: Final = 8_000
#: Characters of an image's ``data:`` URL drawn on the page; a bigger one is a link (a
#: 4 MB photo would make a 5 MB page).
IMAGE_INLINE_LIMIT: Final = 1_000_000

# Control characters (but newline and tab), bidirectional controls, zero-width and other
# invisible format characters: shown as <U+XXXX>, so a transcript cannot hide or reorder
# what the page shows.
_INVISIBLE: Final = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2069\ufeff\ufff9-\ufffb]"
)
_RASTER_DATA_URL: Final = re.compile(
    r"data:image/(?:png|jpeg|gif|webp);base64,[A-Za-z0-9+/]+={0,2}", re.ASCII
)


def visible(text: str) -> str:
    """``text`` with its invisible and direction-changing characters spelled out."""
    return _INVISIBLE.sub(lambda match: f"<U+{ord(match.group()):04X}>", text)


def clipped(text: str, limit: int = TEXT_LIMIT) -> str:
    text = visible(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters: see the whole message)"


def as_json(value: Any, limit: int = JSON_LIMIT) -> str:
    """A JSON value pretty-printed for reading (escaped by the template, never parsed)."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return clipped(text, limit)


# -- transcript ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One content part as the page shows it."""

    kind: Literal["text", "image", "big-image", "file", "other"]
    text: str = ""
    #: A checked raster ``data:image/...;base64,`` URL (``image`` only).
    data_url: str | None = None
    #: Its place in the message's content (for ``big-image``: the link to it).
    index: int = 0


@dataclass
class ToolCall:
    """An assistant's tool call and, when the page has it, the tool's answer."""

    call_id: str
    name: str
    arguments: str
    output: MessageView | None = None


@dataclass
class MessageView:
    """One message of a transcript page."""

    seq: int
    #: What the page calls it: the chat role, or a Responses item's type (escaped text).
    role: str
    #: Its style, one of :data:`ROLE_CLASSES` (never built from stored text).
    css: str
    timestamp: datetime
    key: str
    parts: list[Part]
    reasoning: str | None
    tool_calls: list[ToolCall]
    tool_call_id: str | None
    #: The call this message answers (a tool message, a ``*_output`` item).
    answers: str | None
    tool_name: str | None
    finish_reason: str | None
    token_count: int | None
    extra: str | None
    #: Labels a later state of the message adds (``retracted``, ``compacted``, ``forked``
    #: once transcripts can be edited): each becomes a badge and a CSS class.
    marks: list[str] = field(default_factory=list)
    #: A tool answer shown inside its call on this page (not again on its own).
    paired: bool = False
    #: Something of it was cut on the page: the whole message is a link away.
    cut: bool = False


def content_parts(content: Any) -> list[Part]:
    """The parts of a message's content: text, images (OpenAI ``image_url`` and
    Anthropic-style ``image`` parts with a base64 source), files and anything else as
    JSON."""
    if content is None:
        return []
    if isinstance(content, str):
        return [Part("text", clipped(content))]
    items = content if isinstance(content, list) else [content]
    parts = [_part(item) for item in items]
    for index, part in enumerate(parts):
        object.__setattr__(part, "index", index)  # a frozen dataclass, made just above
    return parts


#: Content parts that are text, in the chat and Responses formats.
_TEXT_PARTS: Final = frozenset(
    ("text", "input_text", "output_text", "summary_text", "reasoning_text")
)


def _part(item: Any) -> Part:  # noqa: PLR0911 (one return per kind of part)
    if isinstance(item, str):
        return Part("text", clipped(item))
    if not isinstance(item, dict):
        return Part("other", as_json(item))
    kind = item.get("type")
    if kind in _TEXT_PARTS and isinstance(item.get("text"), str):
        return Part("text", clipped(item["text"]))
    if kind == "refusal" and isinstance(item.get("refusal"), str):
        return Part("text", clipped("refused: " + item["refusal"]))
    if kind in ("image_url", "input_image", "image", "computer_screenshot"):
        url = _image_url(item)
        if url is not None and _RASTER_DATA_URL.fullmatch(url):
            if len(url) > IMAGE_INLINE_LIMIT:
                return Part(
                    "big-image",
                    f"image ({len(url):,} characters, about {len(url) * 3 // 4 / 1e6:.1f} MB):"
                    " too big to draw on the page",
                )
            return Part("image", f"image ({len(url):,} characters)", data_url=url)
        # An image by address (or an SVG, or malformed): named, never fetched or linked.
        return Part("other", as_json(item))
    if kind in ("file", "input_file", "input_audio"):
        return Part("file", _file_label(item))
    return Part("other", as_json(item))


def image_data(content: Any, index: int) -> tuple[str, bytes] | None:
    """The media type and bytes of the raster ``data:`` image at ``content[index]``
    (``None``: no such image). The bytes must be what the type says (their magic
    number), so nothing but an image is ever served as one."""
    if not isinstance(content, list) or not 0 <= index < len(content):
        return None
    item = content[index]
    url = _image_url(item) if isinstance(item, dict) else None
    if url is None or not _RASTER_DATA_URL.fullmatch(url):
        return None
    header, _, encoded = url.partition(",")
    media = header.removeprefix("data:").removesuffix(";base64")
    try:
        data = base64.b64decode(encoded, validate=True)
    except ValueError:
        return None
    magic = {
        "image/png": data[:8] == b"\x89PNG\r\n\x1a\n",
        "image/jpeg": data[:3] == b"\xff\xd8\xff",
        "image/gif": data[:4] == b"GIF8",
        "image/webp": data[:4] == b"RIFF" and data[8:12] == b"WEBP",
    }
    return (media, data) if magic.get(media) else None


def _image_url(item: dict[str, Any]) -> str | None:
    image = item.get("image_url")
    if isinstance(image, dict):
        image = image.get("url")
    if isinstance(image, str):
        return image
    source = item.get("source")
    if isinstance(source, dict) and source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        if isinstance(media, str) and isinstance(data, str):
            return f"data:{media};base64,{data}"
    return None


def _file_label(item: dict[str, Any]) -> str:
    body = next((v for k, v in item.items() if k != "type" and isinstance(v, dict)), {})
    name = body.get("filename") or body.get("file_id") or body.get("format") or "file"
    data = body.get("file_data") or body.get("data") or ""
    size = f", {len(data):,} characters of data" if isinstance(data, str) and data else ""
    return visible(f"{item.get('type')}: {name}{size}")


#: The CSS class of each kind of message (``role-<name>``): a fixed set, so stored data
#: never names a class. A Responses item is styled as its chat equivalent: a call as the
#: assistant's, its output as a tool answer, reasoning as its own kind, the rest as items.
ROLE_CLASSES: Final = frozenset(
    ("system", "developer", "user", "assistant", "tool", "function", "reasoning", "item")
)
#: Keys of a call item shown as its header (the rest is its arguments or "Other fields").
_CALL_HEADER: Final = ("type", "call_id", "name")


def _arguments(arguments: Any) -> str:
    """A call's arguments for reading: a JSON string pretty-printed, anything else as JSON."""
    if isinstance(arguments, str):
        try:
            return as_json(json.loads(arguments))
        except ValueError:
            return clipped(arguments, JSON_LIMIT)
    return as_json(arguments)


def _chat_calls(message: StoredMessage) -> list[ToolCall]:
    calls = []
    for number, call in enumerate(message.tool_calls or []):
        function = call.get("function") if isinstance(call, dict) else None
        function = function if isinstance(function, dict) else {}
        call_id = call.get("id") if isinstance(call, dict) else None
        arguments = function.get("arguments")
        calls.append(
            ToolCall(
                call_id=visible(str(call_id if call_id is not None else f"#{number}")),
                name=visible(str(function.get("name") or "tool")),
                arguments=_arguments(arguments if arguments is not None else call),
            )
        )
    return calls


def _item_kind(kind: str, message: StoredMessage) -> str:
    """The fixed class (:data:`ROLE_CLASSES`) of a Responses item of type ``kind``."""
    if kind == "reasoning":
        return "reasoning"
    if answered_call(message) is not None or kind.endswith("_output"):
        return "tool"
    if kind.endswith("_call") or kind in CLIENT_CALL_TYPES:
        return "assistant"
    return "item"


def _item_view(message: StoredMessage, view: MessageView) -> None:
    """Fill ``view`` for a Responses-API item, as its chat equivalent is shown: a call
    as a folded tool call, an output as a tool answer (paired with its call), a
    reasoning item's summary as its text and its reasoning folded."""
    kind = message.item_type or "unknown"
    extra = dict(message.extra)
    view.role = visible(kind)
    view.css = _item_kind(kind, message)
    if view.css == "assistant" and isinstance(extra.get("call_id", extra.get("id")), str):
        call_id = extra.get("call_id", extra.get("id"))
        name = extra.get("name")
        shown = {k: v for k, v in extra.items() if k not in (*_CALL_HEADER, "id", "status")}
        if "arguments" in extra or "input" in extra:
            arguments = _arguments(extra.pop("arguments" if "arguments" in extra else "input"))
        else:
            arguments = as_json(shown)  # an action, a command, a patch: all of it
            extra = {k: v for k, v in extra.items() if k not in shown}
        for key in _CALL_HEADER:
            extra.pop(key, None)
        view.tool_calls = [
            ToolCall(
                call_id=visible(str(call_id)),
                name=visible(str(name if name is not None else kind)),
                arguments=arguments,
            )
        ]
    elif view.css == "tool":
        # The client-run calls' outputs, and any other ``*_output`` naming its call.
        answered = answered_call(message) or extra.get("call_id")
        view.answers = visible(answered) if isinstance(answered, str) else None
        if "output" in extra:
            view.parts = view.parts + content_parts(extra.pop("output"))
        extra.pop("call_id", None)
        extra.pop("type", None)
    elif view.css == "reasoning":
        summary = extra.pop("summary", None)
        texts = [p for p in content_parts(summary) if p.kind == "text"] if summary else []
        # The reasoning itself (``reasoning_text`` parts) is folded, as a chat
        # message's ``reasoning`` is.
        thought = [p.text for p in view.parts if p.kind == "text"]
        others = [p for p in view.parts if p.kind != "text"]
        view.parts = texts + others
        view.reasoning = "\n\n".join(thought) or view.reasoning
        extra.pop("type", None)
    view.extra = as_json(extra) if extra else None


def message_view(message: StoredMessage) -> MessageView:
    view = MessageView(
        seq=message.seq,
        role=message.role or "item",
        css=message.role or "item",
        timestamp=message.timestamp,
        key=str(message.client_msg_uuid),
        parts=content_parts(message.content),
        reasoning=None if message.reasoning is None else clipped(message.reasoning),
        tool_calls=_chat_calls(message),
        tool_call_id=None if message.tool_call_id is None else visible(message.tool_call_id),
        answers=None,
        tool_name=None if message.tool_name is None else visible(message.tool_name),
        finish_reason=message.finish_reason,
        token_count=message.token_count,
        extra=as_json(message.extra) if message.extra else None,
        marks=[message.superseded] if message.superseded else [],
    )
    if message.role is None:
        _item_view(message, view)
    elif message.role == "tool":
        view.answers = view.tool_call_id
    view.cut = (
        _text_size(message.content) > TEXT_LIMIT
        or len(message.reasoning or "") > TEXT_LIMIT
        or _text_size(message.tool_calls) > JSON_LIMIT
        or _text_size(message.extra) > JSON_LIMIT
    )
    return view


def _text_size(value: Any) -> int:
    """About how many characters of ``value`` the page shows as text (an image's data
    URL not counted: it is drawn, or linked, not cut)."""
    if isinstance(value, str):
        return 0 if value.startswith("data:") else len(value)
    if isinstance(value, dict):
        return sum(_text_size(v) + len(str(k)) for k, v in value.items())
    if isinstance(value, list):
        return sum(_text_size(v) for v in value)
    return 0


def whole_text(message: StoredMessage) -> str:
    """Every value of ``message`` in full, as plain text for reading (invisible and
    direction-changing characters spelled out, as on the page): its text, reasoning,
    tool calls and the other fields as JSON."""
    out = [f"#{message.seq} {message.role or message.item_type or 'item'}"]
    content = message.content
    for item in content if isinstance(content, list) else [content]:
        if item is None:
            continue
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and isinstance(item.get("text"), str):
            out.append(item["text"])
        else:
            out.append(json.dumps(item, indent=2, ensure_ascii=False, default=str))
    if message.reasoning:
        out.append("reasoning:\n" + message.reasoning)
    for call in message.tool_calls or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            out.append(f"tool call {function.get('name')}:\n{function['arguments']}")
        else:
            out.append("tool call:\n" + json.dumps(call, indent=2, ensure_ascii=False))
    extra = dict(message.extra)
    for key in ("output", "arguments", "input"):
        if isinstance(extra.get(key), str):
            out.append(f"{key}:\n{extra.pop(key)}")
    if extra:
        out.append("other fields:\n" + json.dumps(extra, indent=2, ensure_ascii=False, default=str))
    return visible("\n\n".join(out)) + "\n"


def pair_tool_outputs(views: Sequence[MessageView]) -> list[MessageView]:
    """Put each tool answer (a ``tool`` message, a ``*_output`` item) inside the call it
    answers when both are on the page; the answers so placed are marked ``paired`` (the
    page shows them only there)."""
    open_calls: dict[str, ToolCall] = {}
    for view in views:
        for call in view.tool_calls:
            open_calls[call.call_id] = call
        if view.answers is not None:
            answered = open_calls.pop(view.answers, None)
            if answered is not None and answered.output is None:
                answered.output = view
                view.paired = True
    return list(views)


@dataclass
class TranscriptPage:
    session: Session
    #: The session and its ancestors, oldest first.
    chain: list[Session]
    #: The live end of its continuation chain (itself when it has no child).
    tip: Session
    messages: list[MessageView]
    #: ``after=`` of the next page, ``before=`` of the previous one (``None``: none).
    next_after: int | None
    previous_before: int | None


def transcript_page(
    repository: SessionRepository,
    session_id: str,
    *,
    after: int | None = None,
    before: int | None = None,
    limit: int = TRANSCRIPT_PAGE,
) -> TranscriptPage:
    if after is not None and before is not None:
        raise InvalidArgument("before", "give after or before, not both")
    session = repository.get_session(session_id)
    chain = repository.session_chain(session_id)
    tip = repository.resolve_tip(session_id)
    next_after: int | None
    if before is not None:
        loaded = repository.load_transcript(session_id, before_seq=before, limit=limit + 1)
        page = loaded[-limit:]
        # Paging back from ``before``: the messages from there on are the next page,
        # when there are any (the newest page, ``before`` past the end, has none).
        later = page[-1].seq if page else max(before - 1, 0)
        more = repository.load_transcript(session_id, after_seq=later, limit=1)
        next_after = later if more else None
        previous_before = page[0].seq if len(loaded) > limit else None
    else:
        loaded = repository.load_transcript(session_id, after_seq=after, limit=limit + 1)
        page = loaded[:limit]
        next_after = page[-1].seq if len(loaded) > limit else None
        previous_before = None if after is None else (page[0].seq if page else after + 1)
    views = pair_tool_outputs([message_view(m) for m in page])
    return TranscriptPage(
        session=session,
        chain=chain,
        tip=tip,
        messages=views,
        next_after=next_after,
        previous_before=previous_before,
    )


# -- listing ------------------------------------------------------------------------------


@dataclass
class ListingPage:
    sessions: list[SessionSummary]
    next_cursor: str | None


def listing_page(
    repository: SessionRepository,
    *,
    source: str | None = None,
    user_id: str | None = None,
    status: Literal["open", "ended"] | None = None,
    since: datetime | None = None,
    cursor: str | None = None,
    limit: int = LISTING_PAGE,
) -> ListingPage:
    """A page of the repository's own keyset listing (newest activity first). ``since``
    ends the listing at the first session last active before it: the order makes every
    later one older still, so no page after it is read."""
    page = repository.list_sessions(
        source=source, user_id=user_id, status=status, limit=limit, cursor=cursor
    )
    if since is None:
        return ListingPage(list(page.sessions), page.next_cursor)
    kept = [s for s in page.sessions if s.last_active_at is not None and s.last_active_at >= since]
    return ListingPage(kept, page.next_cursor if len(kept) == len(page.sessions) else None)


# -- search -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fragment:
    text: str
    match: bool


@dataclass
class HitView:
    hit: SearchHit
    fragments: list[Fragment]


_MARK: Final = re.compile(r"\[([^\[\]]+)\]")


def highlighted(snippet: str, query: str) -> list[Fragment]:
    """The snippet cut into plain and matched fragments. The store marks matches with
    brackets; a bracketed run counts as a match only when its words are the query's (a
    bracket the message itself contains stays plain text)."""
    parsed = parse_query(query)
    wanted = list(parsed.positive)

    def is_match(text: str) -> bool:
        found = words(text)
        return bool(found) and any(
            any(w == t or (term.prefix and w.startswith(t)) for w in found for t in term.words)
            for term in wanted
        )

    fragments: list[Fragment] = []
    cursor = 0
    for mark in _MARK.finditer(snippet):
        if not is_match(mark.group(1)):
            continue
        if mark.start() > cursor:
            fragments.append(Fragment(visible(snippet[cursor : mark.start()]), False))
        fragments.append(Fragment(visible(mark.group(1)), True))
        cursor = mark.end()
    if cursor < len(snippet):
        fragments.append(Fragment(visible(snippet[cursor:]), False))
    return fragments


@dataclass
class SearchPage:
    hits: list[HitView]
    #: ``cursor=`` of the next page (``None``: no more hits).
    next_cursor: int | None
    #: ``cursor=`` of the previous page (``None``: this is the first).
    previous_cursor: int | None = None
    #: What a semantic or hybrid search says it lacked (``None``: nothing).
    notice: str | None = None


def search_page(
    repository: SessionRepository,
    query: str,
    *,
    cursor: int = 0,
    limit: int = SEARCH_PAGE,
    order: Literal["rank", "newest"] = "rank",
    mode: Literal["keyword", "semantic", "hybrid"] = "keyword",
    **filters: Any,
) -> SearchPage:
    hits = repository.search(
        query, order=order, limit=limit + 1, cursor=cursor, mode=mode, **filters
    )
    views = [HitView(hit, highlighted(hit.snippet, query)) for hit in hits[:limit]]
    return SearchPage(
        views,
        cursor + limit if len(hits) > limit else None,
        max(cursor - limit, 0) if cursor > 0 else None,
        notice=getattr(hits, "notice", None),
    )


# -- health -------------------------------------------------------------------------------


@dataclass
class HealthPage:
    doctor: DoctorReport
    #: ``None`` with ``outbox_error`` set when the outbox could not be read.
    outbox: OutboxStatus | None
    outbox_error: str | None
    search_backlog: int | None
    search_state: str | None
    search_reason: str | None
    search_error: str | None


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def search_health(
    repository: SessionRepository,
) -> tuple[int | None, str | None, str | None, str | None]:
    """The search backlog and index state, or the one-line reason they are unknown."""
    try:
        backlog = repository.search_index_backlog()
        state, reason = repository.search_index_state()
    except RepoError as exc:
        return None, None, None, one_line(exc)
    return backlog, state, reason, None


# -- the insights page (sessionrepo.ops.insights, drawn by sessionrepo.web.charts) -------


#: A cost none of whose calls has a price: unknown, never shown as $0.
NO_PRICE = "no price"


def _money(value: float) -> str:
    return f"${value:,.4f}"


def _seconds(value: float) -> str:
    return f"{value:.2f} s"


def insights_page(
    repository: SessionRepository, *, since: datetime | None, until: datetime | None
) -> dict[str, Any]:
    """The charts and tables of ``/insights`` over ``[since, until)``."""
    days = insights(repository, since=since, until=until, by="day")
    models = insights(repository, since=since, until=until, by="model")
    sources = insights(repository, since=since, until=until, by="source")

    def named(key: str | None) -> str:
        return key if key is not None else "(none)"

    def tokens(rows: Sequence[InsightsRow]) -> list[tuple[str, float]]:
        return [(named(r.key), float(r.input_tokens + r.output_tokens)) for r in rows]

    def cost(rows: Sequence[InsightsRow]) -> list[tuple[str, float | None]]:
        return [(named(r.key), r.cost) for r in rows]

    charts = [
        bar_chart("chart-tokens-day", "Tokens per day (input + output)", tokens(days.rows)),
        bar_chart("chart-cost-day", "Cost per day", cost(days.rows), _money, NO_PRICE),
        bar_chart(
            "chart-sessions-day",
            "Sessions per day",
            [(named(r.key), float(r.sessions)) for r in days.rows],
        ),
        bar_chart(
            "chart-messages-day",
            "Messages per day",
            [(named(r.key), float(r.messages)) for r in days.rows],
        ),
        bar_chart("chart-tokens-model", "Tokens per model", tokens(models.rows)),
        bar_chart("chart-cost-model", "Cost per model", cost(models.rows), _money, NO_PRICE),
        bar_chart("chart-tokens-source", "Tokens per source", tokens(sources.rows)),
        bar_chart("chart-cost-source", "Cost per source", cost(sources.rows), _money, NO_PRICE),
    ]
    timed = [r for r in models.rows if r.latency_p50 is not None]
    latency = bar_chart(
        "chart-latency",
        "Model-call latency p95 per model",
        [(named(r.key), r.latency_p95 or 0.0) for r in timed],
        _seconds,
    )
    return {
        "charts": charts,
        "latency": latency,
        "timed": timed,
        "total": days.total,
        "busiest": days.busiest,
    }
