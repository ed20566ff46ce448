"""Request and response bodies of the HTTP API (pydantic models: validation and the OpenAPI schema)."""

from __future__ import annotations

from datetime import date
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memory_pipeline.search.searcher import SearchResult
from memory_pipeline.service.retrieval import RETRIEVAL_MODES  # noqa: F401 - documented beside the Literal

ResultType = Literal["image", "audio", "video", "pdf", "document", "text"]
RetrievalMode = Literal["auto", "text", "native", "hybrid"]


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: what went wrong and the field it concerns."""

    error: str
    field: str | None = None
    hint: str | None = None


class SearchOptions(BaseModel):
    """Every option of `memory search` but the query."""

    model_config = ConfigDict(extra="forbid")
    max_results: int | None = Field(None, ge=1, le=200, description="default: query.max_results")
    min_score: float | None = Field(None, ge=0, le=1, description="default: query.min_score")
    mode: Literal["hybrid", "vector", "fts"] = "hybrid"
    fusion: Literal["weighted", "rrf"] | None = None
    source: str | None = Field(None, max_length=200, description="only this source")
    path: str | None = Field(None, max_length=1000, description="only paths matching this glob (relative to the source)")
    types: list[ResultType] = Field(default_factory=list, max_length=6, description="media types, or text")
    modality: list[str] = Field(default_factory=list, max_length=20, description="markdown, text, session, image, …")
    since: date | None = None
    until: date | None = None
    mmr: bool | None = None
    mmr_lambda: float | None = Field(None, ge=0, le=1)
    recency_half_life_days: float | None = Field(None, ge=0, le=36500)
    render: Literal["none", "plain", "terminal"] = Field("none", description="also answer `text`: the results as `memory search` prints them")

    def search_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``MemoryService.search``."""
        return self.model_dump(exclude={"render", "query", "retrieval_mode"}) | {"types": list(self.types), "modality": list(self.modality)}


class SearchRequest(SearchOptions):
    """`memory search` over HTTP: every option of the command line."""

    query: str = Field(min_length=1, max_length=4000, description="what to look for, in words")


class FileSearchOptions(SearchOptions):
    """`memory search --image/--audio` over HTTP: the options (a JSON object in the ``options`` form field)."""

    query: str = Field("", max_length=4000, description="words to search with, besides the files' derived text")
    retrieval_mode: RetrievalMode = Field("auto", description="auto | text | native | hybrid, as `memory search --retrieval-mode`")


class SearchResponse(BaseModel):
    """Search results, each a ``search.SearchResult`` as `memory search --json` prints it.

    The result's schema is the dataclass itself (one definition, so the API cannot drift from the
    CLI); every field is always sent, so every field is required in the response schema.
    """

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)
    query: str
    results: list[SearchResult]
    text: str | None = None


class LinesResponse(BaseModel):
    path: str
    source: str
    doc_id: str
    from_: int = Field(alias="from")
    to: int
    total_lines: int
    truncated: bool
    text: str
    model_config = ConfigDict(populate_by_name=True)


class NoteRequest(BaseModel):
    """A note to write (appended by default) into a source folder, then indexed."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, max_length=1_000_000)
    path: str | None = Field(None, max_length=1000, description="relative to the source; default memory/YYYY-MM-DD.md")
    source: str | None = Field(None, max_length=200)
    append: bool = True
    index: bool = True


class NoteResponse(BaseModel):
    path: str
    source: str
    doc_id: str
    bytes: int
    indexed: bool
    reason: str | None = Field(None, description="why the note is not indexed (written all the same: indexed is false)")
    run: dict[str, Any] | None = None


class RagQuery(BaseModel):
    """The AgentOS multimodal query: only ``query`` is required."""

    query: str = Field(min_length=1, max_length=4000)
    modalities: list[str] | str | None = Field(None, description="image, audio, document: a JSON array or comma-separated")
    collectionIds: list[str] | str | None = Field(None, description="a JSON array or comma-separated")
    topK: int = Field(10, ge=1, le=100)
    retrievalMode: RetrievalMode = "auto"


class RagHit(BaseModel):
    assetId: str
    score: float
    snippet: str
    locator: str
    modality: str | None
    mimeType: str | None
    originalFileName: str | None
    collectionId: str
    chunkId: str
    path: str


class RagResults(BaseModel):
    query: str
    retrievalMode: str
    nativeUsed: bool
    results: list[RagHit]


class Asset(BaseModel):
    assetId: str
    modality: str | None
    mimeType: str | None
    originalFileName: str | None
    collectionId: str | None
    tags: list[str] | None
    metadata: dict[str, Any] | None
    storePayload: bool | None
    sizeBytes: int | None
    createdAt: str | None
    derivedText: str
    chunkCount: int
    path: str


class Deleted(BaseModel):
    assetId: str
    deleted: bool
    rowsDeleted: int


# Typed as what FastAPI's `responses=` takes (its dict is invariant in the key type).
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 401, 404, 413, 415, 422, 500, 503)}
