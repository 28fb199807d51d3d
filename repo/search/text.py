"""Text preparation: what both backends' tokenizers are given, prepared in Python.

Content parts are reduced to their text, the first :data:`INDEX_CHARS` characters are
kept, case is folded, Latin and Cyrillic diacritics are dropped, and every CJK character,
emoji or other symbol becomes a word of its own (symbols as ``u`` + hex code point), so
SQLite's ``unicode61`` tokenizer and PostgreSQL's parser see exactly the same words.
Queries (:mod:`.query`) and snippets (:mod:`.snippets`) split text into words the same way.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any, Final

#: Characters of each message that are indexed (a 20 MB tool output is findable by its
#: beginning; the rest is stored, not indexed).
INDEX_CHARS: Final = 100_000

#: CJK ideographs, kana, Hangul and their compatibility forms: one character, one word.
CJK: Final = (
    "\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u31a0-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uffdc"
    "\U00020000-\U0003134f"
)
_CJK_CHAR = re.compile(f"[{CJK}]")
#: Combining diacritical marks (the block Latin, Greek and Cyrillic letters take; kana
#: voicing marks and other scripts' marks are elsewhere and stay).
_LATIN_MARKS = re.compile("[\u0300-\u036f]+")
#: A word, for the index and for queries: letters and digits only, so that SQLite's
#: unicode61 tokenizer and PostgreSQL's parser (which would keep "3.14", "a-b" or an
#: e-mail address whole) see exactly the same words.
WORD: Final = re.compile(r"[^\W_]+")


def normalize(text: str) -> str:
    """The text as both backends' tokenizers are given it (see the module docstring)."""
    if text.isascii():  # the common case: nothing to decompose, segment or translate
        return text.lower()
    text = unicodedata.normalize("NFKD", text.casefold())
    text = _LATIN_MARKS.sub("", text)
    text = unicodedata.normalize("NFC", text)
    text = _CJK_CHAR.sub(r" \g<0> ", text)
    return _NOT_WORD.sub(_symbol_or_mark, text)


def words(text: str) -> list[str]:
    """The index words of ``text``, in order."""
    return WORD.findall(normalize(text))


#: Non-ASCII characters that are not letters, digits or spaces: symbols (emoji) become
#: words, marks and format characters vanish. ASCII punctuation and symbols separate.
_NOT_WORD = re.compile(r"[^\w\s\x00-\x7f]")


def _symbol_or_mark(match: re.Match[str]) -> str:
    char = match.group()
    category = unicodedata.category(char)
    if category in ("So", "Sk", "Sm", "Sc"):
        return f" u{ord(char):x} "
    if category in ("Mn", "Me", "Cf"):
        return ""  # variation selectors, ZWJ, stray marks: not part of any word
    return char


def content_text(content: Any) -> str:
    """The searchable text of a message's content: the string, or the text of its parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    _collect_text(content, texts)
    return "\n".join(texts)


#: The keys of an OpenAI Responses item whose text is searchable beside its content:
#: function and custom tool call arguments and input, tool outputs, reasoning summaries,
#: code, search queries and results (and the ``name`` of the tool an item calls).
ITEM_TEXT_KEYS: Final = ("arguments", "input", "output", "summary", "code", "queries", "result")


def searchable(
    content: Any, extra: Any, tool_calls: Any = None, tool_name: str | None = None
) -> Any:
    """What is searched of a message, as content parts when it is more than its content:
    the content; the tool name a tool result names; each tool call it makes, as
    ``name(arguments)`` (chat ``tool_calls``, function or custom; a legacy
    ``function_call``); and for a Responses item (``extra`` has a ``type``) the name of
    the tool it calls and the text of its :data:`ITEM_TEXT_KEYS`."""
    texts: list[str] = []
    if tool_name:
        texts.append(tool_name)
    if isinstance(tool_calls, list):
        texts += [_call_text(call) for call in tool_calls]
    if type(extra) is dict:
        if isinstance(extra.get("type"), str):
            texts += _item_texts(extra)
        elif isinstance(extra.get("function_call"), dict):
            texts.append(_call_text({"function": extra["function_call"]}))
    texts = [text for text in texts if text]
    if not texts:
        return content
    if content is not None:
        texts.insert(0, content_text(content))
    return [{"text": text} for text in texts]


def _call_text(call: Any) -> str:
    """``name(arguments)`` of a chat tool call (``{"function": {...}}``, or a custom
    tool's ``{"type": "custom", "custom": {"name", "input"}}``)."""
    if not isinstance(call, dict):
        return ""
    named = call.get("function")
    if not isinstance(named, dict):
        named = call.get(call.get("type")) if isinstance(call.get("type"), str) else None
    if not isinstance(named, dict):
        return ""
    name = named.get("name")
    arguments = named.get("arguments", named.get("input"))
    if arguments is not None and not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    name = name if isinstance(name, str) else ""
    return f"{name}({arguments})" if arguments else name


def _item_texts(item: dict[str, Any]) -> list[str]:
    texts: list[str] = []
    name = item.get("name")
    for key in ITEM_TEXT_KEYS:
        value = item.get(key)
        if isinstance(name, str) and key == "arguments" and isinstance(value, str):
            texts.append(f"{name}({value})")  # as a chat tool call reads
            name = None
        elif isinstance(value, str):
            texts.append(value)
        elif isinstance(value, list) and all(isinstance(entry, str) for entry in value):
            texts += value
        elif isinstance(value, dict | list):
            texts.append(content_text(value))
    if isinstance(name, str):
        texts.insert(0, name)
    return texts


#: How the text of a content part begins in stored content (compact JSON, as the store
#: writes it). Outside a JSON string a quote is never escaped, so this is always a key.
JSON_TEXT_KEY: Final = '"text":"'
#: A JSON string's body (group 1) and its closing quote (group 2: none where it was cut).
_JSON_STRING = re.compile(r'"((?:[^"\\]|\\.)*)(")?')
_JSON_TEXT_VALUE = re.compile(r'"text":(?=")')
_CUT_ESCAPE = re.compile(r"\\u[0-9a-fA-F]{0,3}$")


def json_text_values(fragment: str) -> list[str]:
    """The string values of the ``"text"`` keys in a piece of compact JSON that may be cut
    anywhere (the last one as far as it goes): the text of content parts read from a
    slice of the stored content, without the rest (a 5 MB image beside them, say)."""
    texts: list[str] = []
    for key in _JSON_TEXT_VALUE.finditer(fragment):
        value = json_string_head(fragment, key.end())
        if value is None:
            break
        texts.append(value)
    return texts


def json_string_head(fragment: str, at: int = 0) -> str | None:
    """The JSON string that starts at ``fragment[at]``, as far as the fragment goes
    (``None``: no JSON string starts there)."""
    match = _JSON_STRING.match(fragment, at)
    if match is None:
        return None
    body = match.group(1)
    try:
        value: str = json.loads(f'"{body}"')
    except ValueError:
        if match.group(2):  # a whole string that does not decode: not JSON after all
            return None
        try:  # cut inside a \u escape: the string up to it
            value = json.loads(f'"{_CUT_ESCAPE.sub("", body)}"')
        except ValueError:
            return None
    return value


def _collect_text(value: Any, texts: list[str]) -> None:
    if isinstance(value, dict):
        text = value.get("text")
        if isinstance(text, str):
            texts.append(text)
        for key, item in value.items():
            if key != "text" and isinstance(item, dict | list):
                _collect_text(item, texts)
    elif isinstance(value, list):
        for item in value:
            _collect_text(item, texts)


def document(content: Any) -> str:
    """What is indexed for a message with this (decoded) content: its words, space apart.

    ASCII text (most of it) is folded in one byte-level pass; in other text only the
    whitespace-separated chunks that hold a non-ASCII character take the Unicode path of
    :func:`normalize` (the words are the same as normalising the whole text: no step of it
    crosses whitespace).
    """
    text = content_text(content)[:INDEX_CHARS]
    if text.isascii():
        return _ascii_words(text)
    pieces: list[str] = []
    last = 0
    for match in _NON_ASCII_CHUNK.finditer(text):
        pieces.append(_ascii_words(text[last : match.start()]))
        pieces.append(" ".join(words(match.group())))
        last = match.end()
    pieces.append(_ascii_words(text[last:]))
    return " ".join(pieces)


#: ASCII letters folded to lower case, digits kept, every other byte a separator.
_ASCII_FOLD = (
    bytes(
        (code | 0x20) if chr(code).isalpha() else code if chr(code).isdigit() else 0x20
        for code in range(128)
    )
    + b" " * 128
)
#: A whitespace-separated chunk holding a non-ASCII character (the lookbehind anchors
#: it at the chunk's start, so a long ASCII run is scanned once, not once per position),
#: or a lone non-ASCII space.
_NON_ASCII_CHUNK = re.compile(r"(?<!\S)\S*?[^\x00-\x7f]\S*|[^\x00-\x7f]")


def _ascii_words(text: str) -> str:
    return text.encode("ascii").translate(_ASCII_FOLD).decode("ascii")
