"""Routes for the memory folder: search, read lines, write a note, status, index."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from memory_pipeline.service.schemas import ERRORS, LinesResponse, NoteRequest, NoteResponse, SearchRequest, SearchResponse

router = APIRouter(prefix="/api/memory", tags=["memory"], responses=ERRORS)


@router.post("/search", response_model=SearchResponse, summary="Hybrid search (every `memory search` option)")
def search(body: SearchRequest, request: Request) -> dict:
    service = request.app.state.memory
    results = service.search(
        body.query, max_results=body.max_results, min_score=body.min_score, mode=body.mode, fusion=body.fusion,
        source=body.source, path=body.path, types=list(body.types), modality=list(body.modality), since=body.since,
        until=body.until, mmr=body.mmr, mmr_lambda=body.mmr_lambda, recency_half_life_days=body.recency_half_life_days,
    )  # fmt: skip
    out = {"query": body.query, "results": [r.to_json() for r in results]}
    if body.render != "none":
        from memory_pipeline.render import render_results

        marks = ("\033[1m", "\033[0m") if body.render == "terminal" else ("**", "**")
        out["text"] = render_results(results, marks) if results else ""
    return out


@router.get("/get", response_model=LinesResponse, response_model_by_alias=True, summary="Read a file's lines (memory_get)")
def get_lines(
    request: Request,
    path: str = Query(..., max_length=4096, description="absolute (as search results give it) or relative to a source"),
    start: int = Query(1, alias="from", ge=1, le=10_000_000, description="first line, 1-based"),
    lines: int | None = Query(None, ge=1, le=2000, description="how many lines (default: up to 2000)"),
    source: str | None = Query(None, max_length=200, description="the source a relative path is in"),
) -> dict:
    return request.app.state.memory.get_lines(path, start=start, lines=lines, source=source)


@router.post("/notes", response_model=NoteResponse, summary="Write (append) a note and index it")
def write_note(body: NoteRequest, request: Request) -> dict:
    return request.app.state.memory.write_note(body.text, path=body.path, source=body.source, append=body.append, index=body.index)


@router.get("/status", summary="Provider, table, sources, last run")
def status(request: Request) -> dict:
    return request.app.state.memory.status()


@router.post("/index", summary="Run `memory index` now (serialized with the server's other writes)")
def index(request: Request) -> dict:
    return request.app.state.memory.index().as_dict()  # the JSON of `memory index --json`
