"""The MCP server (official ``mcp`` SDK): memory_search, memory_get, memory_store, memory_status.

One ``MCPServer`` over a ``MemoryService``: served over stdio by `memory mcp` (its own warm
process) and over streamable HTTP at ``/mcp`` on `memory serve` (sharing the server's warm
searcher). Tools take typed arguments (their JSON schemas come from the annotations) and answer
structured JSON; an error is a tool error naming the argument, never a traceback.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any, Literal

from pydantic import Field

from memory_pipeline.errors import ConfigError, MemoryPipelineError

INSTRUCTIONS = (
    "Long-term memory of this agent. Call memory_search before answering questions about prior work, "
    "decisions, dates, people, preferences or todos; then memory_get to read the lines around a hit. "
    "memory_store saves a note (appended to today's memory/YYYY-MM-DD.md unless a path is given)."
)


def build_mcp(service) -> Any:
    """The MCP server for ``service`` (a ``MemoryService``)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    from memory_pipeline import __version__

    mcp = MCPServer(name="memory_pipeline", instructions=INSTRUCTIONS, version=__version__)

    def fail(err: MemoryPipelineError) -> ToolError:
        key = getattr(err, "key", "")
        # The configuration's default hint does not fit a bad argument (HTTP drops it too).
        hint = err.hint if not (isinstance(err, ConfigError) and err.hint == ConfigError("").hint) else ""
        hint = f" ({hint})" if hint else ""
        return ToolError(f"{key + ': ' if key and key not in str(err) else ''}{err}{hint}")

    @mcp.tool()
    def memory_search(
        query: Annotated[str, Field(min_length=1, max_length=4000, description="what to look for, in words")],
        max_results: Annotated[int | None, Field(ge=1, le=200, description="default: query.max_results")] = None,
        min_score: Annotated[float | None, Field(ge=0, le=1, description="drop weaker results (default: query.min_score)")] = None,
        mode: Annotated[Literal["hybrid", "vector", "fts"], Field(description="hybrid (default), vector or fts")] = "hybrid",
        source: Annotated[str | None, Field(description="only this source")] = None,
        path: Annotated[str | None, Field(description="only paths matching this glob, e.g. memory/2026-*.md")] = None,
        types: Annotated[list[Literal["image", "audio", "video", "pdf", "document", "text"]] | None, Field(description="only these types")] = None,
        since: Annotated[date | None, Field(description="only notes dated on or after (YYYY-MM-DD)")] = None,
        until: Annotated[date | None, Field(description="only notes dated on or before (YYYY-MM-DD)")] = None,
    ) -> dict[str, Any]:
        """Search long-term memory (hybrid vector + full-text); results with path, lines, score and snippet."""
        try:
            results = service.search(query, max_results=max_results, min_score=min_score, mode=mode, source=source,
                                     path=path, types=types, since=since, until=until)  # fmt: skip
        except MemoryPipelineError as err:
            raise fail(err) from err
        return {"query": query, "results": [r.to_json() for r in results]}

    @mcp.tool()
    def memory_get(
        path: Annotated[str, Field(min_length=1, max_length=4096, description="the path of a search result, or relative to a source")],
        from_line: Annotated[int, Field(ge=1, description="first line, 1-based")] = 1,
        lines: Annotated[int | None, Field(ge=1, le=2000, description="how many lines (default: up to 2000)")] = None,
        source: Annotated[str | None, Field(description="the source a relative path is in")] = None,
    ) -> dict[str, Any]:
        """Read lines of a memory file (inside the source folders only)."""
        try:
            return service.get_lines(path, start=from_line, lines=lines, source=source)
        except MemoryPipelineError as err:
            raise fail(err) from err

    @mcp.tool()
    async def memory_store(
        text: Annotated[str, Field(min_length=1, max_length=1_000_000, description="the note, in markdown")],
        path: Annotated[str | None, Field(description="relative to the source; default memory/YYYY-MM-DD.md (today)")] = None,
        source: Annotated[str | None, Field(description="the source folder (default: the first)")] = None,
        append: Annotated[bool, Field(description="append (default) or replace the file")] = True,
    ) -> dict[str, Any]:
        """Save a note into memory and index it, so later searches find it."""
        try:
            out = await service.run_write(service.write_note, text, path=path, source=source, append=append)
        except MemoryPipelineError as err:
            raise fail(err) from err
        # Written but not indexed: "indexed": false and why, not an error (a retry would append the note again).
        return out

    @mcp.tool()
    def memory_status() -> dict[str, Any]:
        """Provider, model, table rows, sources and the last index run."""
        try:
            return service.status()
        except MemoryPipelineError as err:
            raise fail(err) from err

    _refuse_unknown_arguments(mcp)
    return mcp


def _refuse_unknown_arguments(mcp) -> None:
    """Make every tool refuse an argument it does not take (``additionalProperties: false`` in its
    schema, and a tool error naming the argument), as the HTTP API answers 422: an agent that sends
    ``limit`` for ``max_results`` was given the default without a word (the SDK's argument models
    ignore unknown keys)."""
    from pydantic import ConfigDict

    for tool in mcp._tool_manager.list_tools():  # pyright: ignore[reportPrivateUsage] - the SDK has no public hook
        meta = tool.fn_metadata
        base = meta.arg_model
        strict = type(base.__name__, (base,), {"model_config": ConfigDict(**base.model_config, extra="forbid"), "__module__": base.__module__})
        meta.arg_model = strict
        tool.parameters = strict.model_json_schema(by_alias=True)


def run_stdio(settings) -> None:
    """`memory mcp`: the MCP server over stdin/stdout, with its own warm searcher."""
    from memory_pipeline.service.core import MemoryService

    service = MemoryService(settings)
    service.ready = True
    build_mcp(service).run("stdio")


__all__ = ["build_mcp", "run_stdio", "ConfigError"]
