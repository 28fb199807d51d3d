"""The session stores under test. Peers are imported only inside their worker process, so
the harness itself needs none of them installed."""

from __future__ import annotations

import importlib
from typing import Final

from bench.contenders.base import Contender, Unsupported

#: key -> (module, class, distribution whose absence means "not installed")
CONTENDERS: Final = {
    "raw": ("bench.contenders._raw", "Raw", None),
    "sessionrepo": ("bench.contenders._sessionrepo", "SessionRepo", None),
    "raw-autocommit": ("bench.contenders._raw", "RawAutocommit", None),
    "sessionrepo-dicts": ("bench.contenders._sessionrepo", "SessionRepoDicts", None),
    "sessionrepo-async": ("bench.contenders._sessionrepo_async", "SessionRepoAsync", None),
    "writer": ("bench.contenders._sessionrepo", "Writer", None),
    "writer-drainer": ("bench.contenders._sessionrepo", "WriterDrainer", None),
    "sessionrepo-immediate": ("bench.contenders._sessionrepo", "SessionRepoImmediate", None),
    "sessionrepo-noindex": ("bench.contenders._sessionrepo", "SessionRepoNoIndex", None),
    "openai": ("bench.contenders._openai", "OpenAIAgents", "openai-agents"),
    "openai-sqlite": ("bench.contenders._openai", "OpenAISQLite", "openai-agents"),
    "sessionrepo-openai-agents": (
        "bench.contenders._openai",
        "SessionRepoOpenAIAgents",
        "openai-agents",
    ),
    "adk": ("bench.contenders._adk", "GoogleADK", "google-adk"),
    "sessionrepo-adk": ("bench.contenders._adk", "SessionRepoADK", "google-adk"),
    "langchain": ("bench.contenders._langchain", "LangChain", "langchain-community"),
    "sessionrepo-langchain": (
        "bench.contenders._langchain",
        "SessionRepoLangChain",
        "langchain-core",
    ),
}

#: Contenders that exist on some backends only.
BACKENDS: Final = {"openai-sqlite": ("sqlite",)}

LABELS: Final = {
    "raw": "raw driver",
    "raw-autocommit": "raw, one autocommit statement",
    "sessionrepo": "sessionrepo append",
    "sessionrepo-dicts": "sessionrepo append of dicts (validation timed)",
    "sessionrepo-async": "sessionrepo async append",
    "writer": "TranscriptWriter.write",
    "writer-drainer": "TranscriptWriter.write, drainer running",
    "sessionrepo-immediate": 'sessionrepo (search_index="immediate")',
    "sessionrepo-noindex": "sessionrepo (search_index=False)",
    "openai": "OpenAI Agents SQLAlchemySession",
    "openai-sqlite": "OpenAI Agents SQLiteSession",
    "sessionrepo-openai-agents": "sessionrepo SessionRepoSession (OpenAI Agents)",
    "adk": "Google ADK DatabaseSessionService",
    "sessionrepo-adk": "sessionrepo ADK SessionRepoSessionService",
    "langchain": "LangChain SQLChatMessageHistory",
    "sessionrepo-langchain": "sessionrepo SessionRepoChatMessageHistory (LangChain)",
}


def contender_class(key: str) -> type[Contender]:
    module, name, _ = CONTENDERS[key]
    cls: type[Contender] = getattr(importlib.import_module(module), name)
    return cls


__all__ = ["BACKENDS", "CONTENDERS", "LABELS", "Contender", "Unsupported", "contender_class"]
