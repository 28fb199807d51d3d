"""The runnables langchain-core's ``RunnableWithMessageHistory`` tests wrap
(``libs/core/tests/unit_tests/runnables/test_history.py`` in langchain-ai/langchain),
written again for this suite, and the wrapper built without its deprecation warning."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from langchain_core._api.deprecation import LangChainDeprecationWarning
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory


def with_history(
    runnable: Runnable[Any, Any], get_session_history: Callable[..., Any], **keys: Any
) -> RunnableWithMessageHistory:
    """``RunnableWithMessageHistory(...)``: langchain-core 1.3.3 announces its removal in
    2.0 on every construction (the suite turns warnings into errors)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", "RunnableWithMessageHistory is deprecated", LangChainDeprecationWarning
        )
        return RunnableWithMessageHistory(runnable, get_session_history, **keys)


def _said(messages: list[BaseMessage], *more: str) -> str:
    said = [str(m.content) for m in messages if isinstance(m, HumanMessage)]
    return "you said: " + "\n".join([*said, *more])


def echo_messages() -> RunnableLambda[Any, str]:
    """Messages in, a string out (upstream ``test_input_messages``)."""
    return RunnableLambda(_said)


def echo_dict_messages() -> RunnableLambda[Any, str]:
    """A dict with the messages under ``messages`` (upstream ``test_input_dict``)."""
    return RunnableLambda(lambda params: _said(params["messages"]))


def echo_history_and_input() -> RunnableLambda[Any, str]:
    """History under ``history``, the new input under ``input`` (upstream
    ``test_input_dict_with_history_key``)."""
    return RunnableLambda(lambda params: _said(params["history"], params["input"]))


def echo_as_message() -> RunnableLambda[Any, AIMessage]:
    """As above, answering with an ``AIMessage`` (upstream ``test_output_message``)."""
    return RunnableLambda(
        lambda params: AIMessage(content=_said(params["history"], params["input"]))
    )


def echo_as_messages() -> RunnableLambda[Any, list[AIMessage]]:
    """Answering with a list of messages (upstream ``test_output_messages``)."""
    return RunnableLambda(
        lambda params: [AIMessage(content=_said(params["history"], params["input"]))]
    )


def echo_as_dict() -> RunnableLambda[Any, dict[str, list[AIMessage]]]:
    """Answering with a dict of messages under ``output`` (upstream
    ``test_output_dict``)."""
    return RunnableLambda(
        lambda params: {"output": [AIMessage(content=_said(params["history"], params["input"]))]}
    )


def echo_messages_key() -> RunnableLambda[Any, list[BaseMessage]]:
    """Upstream ``test_using_custom_config_specs``'s fake LLM."""
    return RunnableLambda(lambda params: [AIMessage(content=_said(params["messages"]))])


class LengthChatModel(BaseChatModel):
    """A chat model answering with how many messages it was given (upstream's own)."""

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(
            generations=[ChatGeneration(message=AIMessage(content=str(len(messages))))]
        )

    @property
    def _llm_type(self) -> str:
        return "length-fake-chat-model"
