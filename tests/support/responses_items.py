"""One item of every type the OpenAI Responses API takes as input (the members of
``ResponseInputItemParam`` in the OpenAI Python SDK 3.57, ``openai/types/responses/``),
written from the type definitions with realistic values: optional keys included,
nested content parts, nulls, booleans, integers and floats, in the SDK's key order.

Each entry: (the SDK's type name, the item).
"""

from __future__ import annotations

from typing import Any

RESPONSES_ITEMS: list[tuple[str, dict[str, Any]]] = [
    ("EasyInputMessageParam", {"content": "be brief", "role": "developer", "type": "message"}),
    (
        "EasyInputMessageParam:parts",
        {
            "content": [
                {"type": "input_text", "text": "what is in this picture of Mochi?"},
                {"type": "input_image", "detail": "auto", "image_url": "https://x.test/m.png"},
                {"type": "input_file", "file_id": "file-abc", "filename": "vet.pdf"},
            ],
            "role": "user",
            "phase": None,
        },
    ),
    (
        "Message",
        {
            "content": [{"type": "input_text", "text": "system rules here"}],
            "role": "system",
            "status": "completed",
            "type": "message",
        },
    ),
    (
        "ResponseOutputMessageParam",
        {
            "id": "msg_01",
            "content": [
                {
                    "annotations": [
                        {
                            "file_id": "file-abc",
                            "filename": "vet.pdf",
                            "index": 12,
                            "type": "file_citation",
                        }
                    ],
                    "text": "Mochi's vet visit is on Tuesday.",
                    "type": "output_text",
                    "logprobs": [
                        {"token": "Mo", "bytes": [77, 111], "logprob": -0.25, "top_logprobs": []}
                    ],
                },
                {"refusal": "I can't help with that part.", "type": "refusal"},
            ],
            "role": "assistant",
            "status": "completed",
            "type": "message",
            "phase": "final_answer",
        },
    ),
    (
        "ResponseFileSearchToolCallParam",
        {
            "id": "fs_01",
            "queries": ["mochi vaccination record"],
            "status": "completed",
            "type": "file_search_call",
            "results": [
                {
                    "attributes": {"year": 2026, "vet": "Dr. Sato", "urgent": False},
                    "file_id": "file-abc",
                    "filename": "vet.pdf",
                    "score": 0.875,
                    "text": "Rabies booster: 2026-03-01",
                }
            ],
        },
    ),
    (
        "ResponseComputerToolCallParam",
        {
            "id": "cu_01",
            "call_id": "call_cu_01",
            "pending_safety_checks": [
                {"id": "sc_1", "code": "malicious_instructions", "message": "check the page"}
            ],
            "status": "completed",
            "type": "computer_call",
            "action": {"button": "left", "type": "click", "x": 640, "y": 360},
        },
    ),
    (
        "ComputerCallOutput",
        {
            "call_id": "call_cu_01",
            "output": {
                "type": "computer_screenshot",
                "file_id": None,
                "image_url": "data:image/png;base64,iVBORw0KGgo=",
            },
            "type": "computer_call_output",
            "id": None,
            "acknowledged_safety_checks": [{"id": "sc_1", "code": None, "message": None}],
            "status": "completed",
        },
    ),
    (
        "ResponseFunctionWebSearchParam",
        {
            "id": "ws_01",
            "action": {
                "query": "cat vaccination schedule",
                "type": "search",
                "sources": [{"type": "url", "url": "https://vet.test/schedule"}],
            },
            "status": "completed",
            "type": "web_search_call",
        },
    ),
    (
        "ResponseFunctionToolCallParam",
        {
            "arguments": '{"city": "Kyoto", "unit": "celsius"}',
            "call_id": "call_fn_01",
            "name": "get_weather",
            "type": "function_call",
            "id": "fc_01",
            "namespace": "weather",
            "status": "completed",
        },
    ),
    (
        "FunctionCallOutput",
        {
            "output": '{"temperature": 21.5, "sky": "clear"}',
            "type": "function_call_output",
            "id": None,
            "call_id": "call_fn_01",
            "status": "completed",
        },
    ),
    (
        "FunctionCallOutput:parts",
        {
            "call_id": "call_fn_02",
            "output": [
                {"type": "input_text", "text": "chart attached"},
                {"type": "input_image", "image_url": "https://x.test/c.png", "detail": "low"},
            ],
            "type": "function_call_output",
        },
    ),
    (
        "ToolSearchCall",
        {
            "arguments": {"query": "calendar tools", "limit": 3},
            "type": "tool_search_call",
            "id": None,
            "call_id": "call_ts_01",
            "execution": "client",
            "status": "completed",
        },
    ),
    (
        "ResponseToolSearchOutputItemParamParam",
        {
            "tools": [
                {
                    "name": "create_event",
                    "parameters": {"type": "object", "properties": {"title": {"type": "string"}}},
                    "strict": True,
                    "type": "function",
                    "description": "Create a calendar event",
                }
            ],
            "type": "tool_search_output",
            "id": None,
            "call_id": "call_ts_01",
            "execution": "client",
            "status": "completed",
        },
    ),
    (
        "AdditionalTools",
        {
            "role": "developer",
            "tools": [{"type": "web_search", "search_context_size": "low"}],
            "type": "additional_tools",
            "id": None,
        },
    ),
    (
        "ResponseConfigurationUpdateItemParamParam",
        {
            "type": "configuration_update",
            "id": None,
            "reasoning": {"effort": "low", "summary": "auto"},
            "text": {"format": {"type": "text"}, "verbosity": "low"},
        },
    ),
    (
        "ResponseReasoningItemParam",
        {
            "id": "rs_01",
            "summary": [
                {"text": "The user wants the vet date; look in the file.", "type": "summary_text"}
            ],
            "type": "reasoning",
            "content": [{"text": "Search the vet file first.", "type": "reasoning_text"}],
            "encrypted_content": "gAAAAABn-ENCRYPTED==",
            "status": "completed",
        },
    ),
    (
        "ResponseCompactionItemParamParam",
        {"encrypted_content": "gAAAAABn-COMPACTED==", "type": "compaction", "id": "cmp_01"},
    ),
    (
        "ImageGenerationCall",
        {
            "id": "ig_01",
            "result": "iVBORw0KGgoAAAANSUhEUg==",
            "status": "completed",
            "type": "image_generation_call",
            "action": "generate",
            "background": "transparent",
            "output_format": "png",
            "quality": "high",
            "revised_prompt": "a grey cat named Mochi, watercolor",
            "size": "1024x1024",
        },
    ),
    (
        "ResponseCodeInterpreterToolCallParam",
        {
            "id": "ci_01",
            "code": "print(sum(range(10)))",
            "container_id": "cntr_01",
            "outputs": [
                {"logs": "45\n", "type": "logs"},
                {"type": "image", "url": "https://x.test/p.png"},
            ],
            "status": "completed",
            "type": "code_interpreter_call",
        },
    ),
    (
        "LocalShellCall",
        {
            "id": "lsh_01",
            "action": {
                "command": ["ls", "-la"],
                "env": {"LANG": "C.UTF-8"},
                "type": "exec",
                "timeout_ms": 5000,
                "user": None,
                "working_directory": "/tmp",
            },
            "call_id": "call_lsh_01",
            "status": "completed",
            "type": "local_shell_call",
        },
    ),
    (
        "LocalShellCallOutput",
        {
            "id": "call_lsh_01",
            "output": "total 0\n",
            "type": "local_shell_call_output",
            "status": None,
        },
    ),
    (
        "ShellCall",
        {
            "action": {"commands": ["uname -a"], "max_output_length": 4096, "timeout_ms": None},
            "call_id": "call_sh_01",
            "type": "shell_call",
            "id": None,
            "environment": {"type": "local"},
            "status": "completed",
        },
    ),
    (
        "ShellCallOutput",
        {
            "call_id": "call_sh_01",
            "output": [
                {"outcome": {"exit_code": 0, "type": "exit"}, "stderr": "", "stdout": "Linux\n"}
            ],
            "type": "shell_call_output",
            "id": None,
            "max_output_length": 4096,
            "status": "completed",
        },
    ),
    (
        "ApplyPatchCall",
        {
            "call_id": "call_ap_01",
            "operation": {
                "diff": "@@ -1 +1 @@\n-old\n+new\n",
                "path": "notes.txt",
                "type": "update_file",
            },
            "status": "completed",
            "type": "apply_patch_call",
            "id": None,
        },
    ),
    (
        "ApplyPatchCallOutput",
        {
            "call_id": "call_ap_01",
            "status": "completed",
            "type": "apply_patch_call_output",
            "id": None,
            "output": "patched notes.txt",
        },
    ),
    (
        "McpListTools",
        {
            "id": "mcpl_01",
            "server_label": "calendar",
            "tools": [
                {
                    "input_schema": {"type": "object", "properties": {}},
                    "name": "list_events",
                    "annotations": None,
                    "description": "List events",
                }
            ],
            "type": "mcp_list_tools",
            "error": None,
        },
    ),
    (
        "McpApprovalRequest",
        {
            "id": "mcpr_01",
            "arguments": '{"day": "tuesday"}',
            "name": "list_events",
            "server_label": "calendar",
            "type": "mcp_approval_request",
        },
    ),
    (
        "McpApprovalResponse",
        {
            "approval_request_id": "mcpr_01",
            "approve": True,
            "type": "mcp_approval_response",
            "id": None,
            "reason": None,
        },
    ),
    (
        "McpCall",
        {
            "id": "mcp_01",
            "arguments": '{"day": "tuesday"}',
            "name": "list_events",
            "server_label": "calendar",
            "type": "mcp_call",
            "approval_request_id": "mcpr_01",
            "error": None,
            "output": "vet visit 10:00",
            "status": "completed",
        },
    ),
    (
        "ResponseCustomToolCallParam",
        {
            "call_id": "call_ct_01",
            "input": "SELECT count(*) FROM visits",
            "name": "sql",
            "type": "custom_tool_call",
            "id": "ctc_01",
            "namespace": "db",
        },
    ),
    (
        "ResponseCustomToolCallOutputParam",
        {
            "call_id": "call_ct_01",
            "output": "3",
            "type": "custom_tool_call_output",
            "id": "ctco_01",
        },
    ),
    ("CompactionTrigger", {"type": "compaction_trigger", "id": None}),
    ("ItemReference", {"id": "msg_01", "type": "item_reference"}),
    (
        "Program",
        {
            "id": "prg_01",
            "call_id": "call_prg_01",
            "code": "return 2 + 2",
            "fingerprint": "sha256:ab12",
            "type": "program",
        },
    ),
    (
        "ProgramOutput",
        {
            "id": "prgo_01",
            "call_id": "call_prg_01",
            "result": "4",
            "status": "completed",
            "type": "program_output",
        },
    ),
]

#: Chat Completions messages with the roles added by issue 14.
CHAT_MESSAGES: list[dict[str, Any]] = [
    {"role": "developer", "content": "be brief"},
    {"role": "developer", "content": [{"type": "text", "text": "answer in French"}], "name": "ops"},
    {"role": "assistant", "content": None, "function_call": {"name": "lookup", "arguments": "{}"}},
    {"role": "function", "name": "lookup", "content": '{"found": true}'},
]
