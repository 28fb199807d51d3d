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
    "sessionrepo-async": ("bench.contenders._sessionrepo_async", "SessionRepoAsync", None),
    "sessionrepo-immediate": ("bench.contenders._sessionrepo", "SessionRepoImmediate", None),
    "sessionrepo-noindex": ("bench.contenders._sessionrepo", "SessionRepoNoIndex", None),
    "openai": ("bench.contenders._openai", "OpenAIAgents", "openai-agents"),
    "adk": ("bench.contenders._adk", "GoogleADK", "google-adk"),
    "langchain": ("bench.contenders._langchain", "LangChain", "langchain-community"),
}

LABELS: Final = {
    "raw": "raw driver",
    "sessionrepo": "sessionrepo",
    "sessionrepo-async": "sessionrepo (async)",
    "sessionrepo-immediate": 'sessionrepo (search_index="immediate")',
    "sessionrepo-noindex": "sessionrepo (search_index=False)",
    "openai": "OpenAI Agents SQLAlchemySession",
    "adk": "Google ADK DatabaseSessionService",
    "langchain": "LangChain SQLChatMessageHistory",
}


def contender_class(key: str) -> type[Contender]:
    module, name, _ = CONTENDERS[key]
    cls: type[Contender] = getattr(importlib.import_module(module), name)
    return cls


__all__ = ["CONTENDERS", "LABELS", "Contender", "Unsupported", "contender_class"]
