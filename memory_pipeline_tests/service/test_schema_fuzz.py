"""Property-based API fuzzing of the live server against its own OpenAPI schema (schemathesis):
no 5xx, every status documented, every response body matching its schema. Bounded: a few dozen
examples per route. Routes that start an index run on valid input (notes, index, document
ingest) get a few examples each, in their own test after the others (what they write into the
folder is junk the read routes need not see).

Operations are driven with hypothesis directly (``operation.as_strategy()``): schemathesis'
pytest loader does not run under pytest 9.
"""

from __future__ import annotations

import os
import re

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

pytestmark = pytest.mark.slow
EXAMPLES = int(os.environ.get("MEMORY_PIPELINE_FUZZ_EXAMPLES", "25"))
WRITE_EXAMPLES = int(os.environ.get("MEMORY_PIPELINE_FUZZ_WRITE_EXAMPLES", "5"))
WRITES = re.compile(r"^/api/memory/(notes|index)$|/documents/ingest$")
MCP = re.compile(r"^/mcp")
# Seconds a request may take: schemathesis' default (10 s) is a timed assertion, and a valid write
# is an index run, which took longer than that on a loaded 2-core machine (the suite's other worker
# running). Conformance is what is tested here, not speed.
REQUEST_TIMEOUT_S = 120


def _fuzz(server, *, writes: bool, examples: int) -> dict[str, set[int]]:
    """Each operation (the writing ones, or all the others) against its schema: the statuses seen, by operation."""
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance, status_code_conformance

    # What the API promises: no 5xx, documented statuses and bodies. (A schema-valid request may
    # still be refused: a well-formed path outside the sources is a 422, not a hole in the schema.)
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    statuses: dict[str, set[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        if MCP.search(operation.path) or bool(WRITES.search(operation.path)) != writes:
            continue

        statuses[f"{operation.method.upper()} {operation.path}"] = _run(operation, server.url, checks, examples)
    return statuses


def _run(operation, base_url: str, checks: list, examples: int) -> set[int]:
    seen: set[int] = set()

    @given(case=operation.as_strategy())
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case):
        seen.add(case.call_and_validate(base_url=base_url, checks=checks, timeout=REQUEST_TIMEOUT_S).status_code)

    check()
    return seen


def test_api_against_its_schema(server):
    tested = _fuzz(server, writes=False, examples=EXAMPLES)
    assert len(tested) >= 12, sorted(tested)


def test_writing_routes_against_their_schema(server):
    """Notes, index and document ingest: a few examples each (every valid one is an index run)."""
    tested = _fuzz(server, writes=True, examples=WRITE_EXAMPLES)
    assert sorted(tested) == ["POST /api/agentos/rag/multimodal/documents/ingest", "POST /api/memory/index", "POST /api/memory/notes"], tested
    assert 200 in tested["POST /api/memory/notes"] | tested["POST /api/agentos/rag/multimodal/documents/ingest"], tested  # valid writes were made
    assert server.http.post("/api/memory/search", json={"query": "daily standup room"}).status_code == 200  # still answers
