"""The JSON API fuzzed against its own OpenAPI description (schemathesis): valid and
invalid requests generated for every operation of a real ``sessionrepo serve`` over the
seeded store; no answer is a server error, every answer matches the description (status
code, content type, body schema), and invalid requests are refused.

Not checked: that every request the schema allows is accepted. Some are refused by
design with a 400 the description lists: a listing cursor is opaque (a string the
server did not issue is invalid), and a session id or a filter with control characters
cannot be one.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from conftest import Server
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

pytestmark = pytest.mark.slow

OPERATIONS = [
    "/api/sessions",
    "/api/session",
    "/api/session/messages",
    "/api/session/export",
    "/api/search",
    "/api/health",
]


@pytest.fixture(scope="session")
def api_schema(console: Server) -> Any:
    return schemathesis.openapi.from_url(console.url("/openapi.json"))


def test_the_description_covers_every_api_path(api_schema: Any) -> None:
    paths = sorted(op.ok().path for op in api_schema.get_all_operations())
    assert paths == sorted(OPERATIONS)


@pytest.mark.parametrize(
    ("path", "mode"),
    [
        (path, mode)
        for path in OPERATIONS
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        if (path, mode) != ("/api/health", GenerationMode.NEGATIVE)  # it takes no parameter
    ],
)
def test_no_request_makes_the_api_fail(
    api_schema: Any, console: Server, path: str, mode: GenerationMode
) -> None:
    operation = api_schema["/" + path.lstrip("/")]["GET"]
    examples = 5 if path == "/api/health" else 10

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def fuzz(case: Any) -> None:
        case.call_and_validate(base_url=console.base, excluded_checks=[positive_data_acceptance])

    fuzz()
