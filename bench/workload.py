"""The workload every contender gets: realistic chat messages, made the same in every process.

A session's transcript is an endless, deterministic stream of OpenAI chat-format dicts (the
form a gateway holds), each stamped with its ``client_msg_uuid`` when it is made, as a
gateway using sessionrepo would. The stream depends only on the seed and the session's
name, so every contender (each in its own process) gets byte-identical messages in the same
order.

Shape (measured by :func:`describe`): text from 50 B to 20 KB (log-normal, by role), about
1 in 8 messages an assistant turn with tool calls, each followed by its tool outputs, of
which about 1 in 40 is a 100 KB blob; about 1.3 KB per message on average.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import uuid
from collections.abc import Iterator
from functools import cache
from typing import Any

#: Lengths (bytes of text) are drawn from a log-normal with these medians, clipped.
MIN_TEXT = 50
MAX_TEXT = 20_000
BIG_TOOL_OUTPUT = 100_000
_MEDIAN = {"system": 1_500, "user": 250, "assistant": 700, "tool": 900}
_SIGMA = 1.0
#: Chance that an assistant message calls tools: tuned so that 1 in 8 messages does.
_TOOL_CALL_CHANCE = 0.28
#: Chance that one tool output is a 100 KB blob.
_BIG_OUTPUT_CHANCE = 1 / 80

_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "so no will more can about said what out up them into could other time only new some "
    "these two may first then do any like my now over such our man me even most made after "
    "also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see "
    "men work long here get both between life being under never day same another know while "
    "last might us great old year off come since against go came right used take three "
    "deploy server request latency database index query cache token session message agent "
    "gateway transcript function error retry timeout config build test commit branch merge "
    "naïve café résumé façade Zürich São Paulo Ελληνικά русский 日本語 中文 한국어 👍 ✅ →"
)
_WORDS = _WORD_TEXT.split()
_TOOLS = ("search_web", "read_file", "run_shell", "query_db", "fetch_url", "edit_file")


@cache
def _corpus(seed: int) -> str:
    """About 256 KB of word salad to slice messages from (fast, deterministic)."""
    rng = random.Random(f"corpus:{seed}")
    words: list[str] = []
    size = 0
    while size < 256_000:
        word = rng.choice(_WORDS)
        if rng.random() < 0.08:
            word += rng.choice(".,;:?!") + ("\n" if rng.random() < 0.3 else "")
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def _text(rng: random.Random, seed: int, length: int) -> str:
    corpus = _corpus(seed)
    if length > len(corpus) // 2:
        repeats = length // (len(corpus) // 2) + 1
        return (corpus * repeats)[:length]
    start = rng.randrange(0, len(corpus) - length)
    return corpus[start : start + length]


def _length(rng: random.Random, role: str) -> int:
    raw = rng.lognormvariate(math.log(_MEDIAN[role]), _SIGMA)
    return max(MIN_TEXT, min(MAX_TEXT, int(raw)))


def _key(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def session_stream(seed: int, session: str) -> Iterator[dict[str, Any]]:
    """The messages of one session's transcript, in order, forever."""
    rng = random.Random(f"session:{seed}:{session}")

    def message(role: str, **fields: Any) -> dict[str, Any]:
        return {"role": role, **fields, "client_msg_uuid": _key(rng)}

    yield message("system", content=_text(rng, seed, _length(rng, "system")))
    while True:
        yield message("user", content=_text(rng, seed, _length(rng, "user")))
        while rng.random() < _TOOL_CALL_CHANCE:
            calls = []
            for _ in range(rng.choice((1, 1, 1, 2, 3))):
                arguments = {
                    "query": _text(rng, seed, rng.randrange(20, 200)),
                    "limit": rng.randrange(1, 50),
                }
                calls.append(
                    {
                        "id": f"call_{rng.getrandbits(64):016x}",
                        "type": "function",
                        "function": {
                            "name": rng.choice(_TOOLS),
                            "arguments": json.dumps(arguments, ensure_ascii=False),
                        },
                    }
                )
            preface = _text(rng, seed, rng.randrange(MIN_TEXT, 300)) if rng.random() < 0.5 else None
            yield message("assistant", content=preface, tool_calls=calls)
            for call in calls:
                size = (
                    BIG_TOOL_OUTPUT if rng.random() < _BIG_OUTPUT_CHANCE else _length(rng, "tool")
                )
                yield message(
                    "tool",
                    tool_call_id=call["id"],
                    content=_text(rng, seed, size),
                )
        yield message("assistant", content=_text(rng, seed, _length(rng, "assistant")))


class Transcripts:
    """Per-session streams with a cursor: ``take(session, n)`` gives the next ``n``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._streams: dict[str, Iterator[dict[str, Any]]] = {}
        self.positions: dict[str, int] = {}

    def take(self, session: str, count: int) -> list[dict[str, Any]]:
        stream = self._streams.get(session)
        if stream is None:
            stream = self._streams[session] = session_stream(self.seed, session)
            self.positions[session] = 0
        self.positions[session] += count
        return [next(stream) for _ in range(count)]


def message_bytes(message: dict[str, Any]) -> int:
    """Size of a message as its JSON (what every contender has to store, roughly)."""
    return len(json.dumps(message, ensure_ascii=False).encode())


def describe(seed: int, sessions: int = 200, per_session: int = 100) -> dict[str, Any]:
    """Measured shape of the workload (for the results page)."""
    sizes: list[int] = []
    with_tools = 0
    big = 0
    for index in range(sessions):
        stream = session_stream(seed, f"shape-{index}")
        for _ in range(per_session):
            message = next(stream)
            size = message_bytes(message)
            sizes.append(size)
            with_tools += "tool_calls" in message
            big += size >= BIG_TOOL_OUTPUT
    sizes.sort()
    return {
        "messages_sampled": len(sizes),
        "mean_bytes": round(statistics.fmean(sizes)),
        "median_bytes": sizes[len(sizes) // 2],
        "min_bytes": sizes[0],
        "p99_bytes": sizes[int(len(sizes) * 0.99)],
        "max_bytes": sizes[-1],
        "with_tool_calls": round(with_tools / len(sizes), 4),
        "outputs_of_100kb": big,
    }
