"""A scripted Agents SDK model for offline runs: each call answers with the next scripted
output and records the input it was given (what the Runner read from the session)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agents.items import (
    ModelResponse,
    TResponseInputItem,
    TResponseOutputItem,
    TResponseStreamEvent,
)
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)


def text_message(text: str, item_id: str) -> ResponseOutputMessage:
    """An assistant answer, with the id a Responses-API model gives it."""
    return ResponseOutputMessage(
        id=item_id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def function_call(
    name: str, arguments: str, call_id: str, item_id: str
) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=item_id, type="function_call", call_id=call_id, name=name, arguments=arguments
    )


class ScriptedModel(Model):
    """Answers each model call with the next entry of ``script``."""

    def __init__(self, script: list[list[TResponseOutputItem]] | None = None) -> None:
        self.script = list(script or [])
        self.inputs: list[list[TResponseInputItem]] = []

    def then(self, *outputs: TResponseOutputItem) -> ScriptedModel:
        self.script.append(list(outputs))
        return self

    def _next(self, input: str | list[TResponseInputItem]) -> list[TResponseOutputItem]:
        self.inputs.append(
            [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        )
        assert self.script, "the model was called more often than scripted"
        return self.script.pop(0)

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        output = self._next(args[1] if len(args) > 1 else kwargs["input"])
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    async def stream_response(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> AsyncIterator[TResponseStreamEvent]:
        output = self._next(args[1] if len(args) > 1 else kwargs["input"])
        response = Response(
            id="resp-scripted",
            created_at=0,
            model="scripted",
            object="response",
            output=output,
            parallel_tool_calls=False,
            tool_choice="auto",
            tools=[],
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )
