"""Routes for the memory folder: search, read lines, write a note, status, index."""

from __future__ import annotations

import contextlib
import os

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from pydantic import ValidationError

from memory_pipeline.errors import ConfigError
from memory_pipeline.service.routes_rag import spooled
from memory_pipeline.service.schemas import (
    ERRORS,
    FileSearchOptions,
    LinesResponse,
    NoteRequest,
    NoteResponse,
    SearchOptions,
    SearchRequest,
    SearchResponse,
)

router = APIRouter(prefix="/api/memory", tags=["memory"], responses=ERRORS)


@router.post("/search", response_model=SearchResponse, summary="Hybrid search (every `memory search` option)")
def search(body: SearchRequest, request: Request) -> dict:
    results = request.app.state.memory.search(body.query, **body.search_kwargs())
    return _answer(body.query, results, body)


@router.post("/search/files", response_model=SearchResponse, summary="Search by an image and/or a recording (`memory search --image/--audio`)")
def search_files(
    request: Request,
    image: UploadFile | None = File(None, description="an image: searched with its OCR text and photo details (and natively)"),
    audio: UploadFile | None = File(None, description="a recording: searched with its transcript (and natively)"),
    options: str = Form("{}", max_length=65536, description="a JSON object: query, retrieval_mode and every option of POST /api/memory/search"),
) -> dict:
    """Answers ``query``: the text searched (the given words and the files' derived text)."""
    service = request.app.state.memory
    try:
        opts = FileSearchOptions.model_validate_json(options)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(["options", *(str(p) for p in first["loc"])])
        raise ConfigError(f"{field}: {first['msg']}", key=field) from None
    uploads = [(kind, part) for kind, part in (("image", image), ("audio", audio)) if part is not None]
    if not uploads:
        raise ConfigError("give an image or audio file part", key="image")
    limit = service.settings.multimodal.max_file_bytes
    with contextlib.ExitStack() as stack:
        paths = [(stack.enter_context(spooled(part, kind, limit))[0], kind) for kind, part in uploads]
        files = [(path, kind, os.path.basename(path)) for path, kind in paths]  # named as uploaded (safe_name)
        searched, results = service.search_files(opts.query, files, retrieval_mode=opts.retrieval_mode, **opts.search_kwargs())
    return _answer(searched, results, opts)


def _answer(query: str, results: list, options: SearchOptions) -> dict:
    out = {"query": query, "results": [r.to_json() for r in results]}
    if options.render != "none":
        from memory_pipeline.render import render_results

        marks = ("\033[1m", "\033[0m") if options.render == "terminal" else ("**", "**")
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
async def write_note(body: NoteRequest, request: Request):
    service = request.app.state.memory
    out = await service.run_write(service.write_note, body.text, path=body.path, source=body.source, append=body.append, index=body.index)
    # Written but not indexed (the run skipped the file): 200 with "indexed": false and why. An error
    # status after the append invited a retry, which appended the note a second time.
    return out


@router.get("/status", summary="Provider, table, sources, last run")
def status(request: Request) -> dict:
    return request.app.state.memory.status()


@router.post("/index", summary="Run `memory index` now (serialized with the server's other writes)")
async def index(request: Request) -> dict:
    service = request.app.state.memory
    return {"ok": True, **(await service.run_write(service.index)).as_dict()}  # the JSON of `memory index --json`
