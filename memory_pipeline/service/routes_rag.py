"""The AgentOS multimodal RAG routes, under ``/api/agentos/rag``: ingest, query, assets."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import FileResponse

from memory_pipeline.errors import ConfigError
from memory_pipeline.service.core import TooLarge
from memory_pipeline.service.files import safe_name
from memory_pipeline.service.schemas import ERRORS, Asset, Deleted, RagQuery, RagResults, RetrievalMode

router = APIRouter(prefix="/api/agentos/rag", tags=["agentos-rag"], responses=ERRORS)


@contextmanager
def spooled(upload: UploadFile, field: str, limit: int):
    """The upload as a file on disk under its (safe) name (removed afterwards), refused past ``limit`` bytes."""
    if upload is None or not hasattr(upload, "file"):
        raise ConfigError(f"{field} must be a file part", key=field)
    name = safe_name(upload.filename)
    with tempfile.TemporaryDirectory(prefix="memory-upload-") as tmp:
        path = os.path.join(tmp, name)
        with open(path, "wb") as out:
            upload.file.seek(0)
            copied = 0
            while block := upload.file.read(1 << 20):
                copied += len(block)
                if copied > limit:
                    raise TooLarge(f"File {name} exceeds {limit} bytes limit for embedding")
                out.write(block)
        yield path, upload.filename


async def _ingest(request: Request, kind: str, field: str, upload, text, metadata, tags, collection, store) -> dict:
    """An ingest, in the threads kept for writes (``MemoryService.run_write``)."""
    assets = request.app.state.assets

    def ingest() -> dict:
        with spooled(upload, field, assets.settings.multimodal.max_file_bytes) as (path, filename):
            return assets.ingest(
                kind, path, filename, field=field, text_representation=text, metadata=metadata, tags=tags,
                collection_id=collection, store_payload=store,
            )  # fmt: skip

    return await request.app.state.memory.run_write(ingest)


_TEXT = Form(None, max_length=1_000_000, description="skips captioning/OCR/transcription: this is the asset's text")
_META = Form(None, max_length=65536, description="a JSON object stored with the asset")
_TAGS = Form(None, max_length=4096, description="a JSON array or comma-separated")
_COLL = Form("default", max_length=64, description="collection id")
_STORE = Form(False, description="keep the original bytes (GET …/content serves them; native vectors use them)")


@router.post("/multimodal/images/ingest", response_model=Asset, summary="Ingest an image")
async def ingest_image(request: Request, image: UploadFile = File(...), textRepresentation: str | None = _TEXT, metadata: str | None = _META,
                 tags: str | None = _TAGS, collectionId: str = _COLL, storePayload: bool = _STORE) -> dict:  # fmt: skip
    return await _ingest(request, "image", "image", image, textRepresentation, metadata, tags, collectionId, storePayload)


@router.post("/multimodal/audio/ingest", response_model=Asset, summary="Ingest a recording")
async def ingest_audio(request: Request, audio: UploadFile = File(...), textRepresentation: str | None = _TEXT, metadata: str | None = _META,
                 tags: str | None = _TAGS, collectionId: str = _COLL, storePayload: bool = _STORE) -> dict:  # fmt: skip
    return await _ingest(request, "audio", "audio", audio, textRepresentation, metadata, tags, collectionId, storePayload)


@router.post("/multimodal/documents/ingest", response_model=Asset, summary="Ingest a document (PDF, DOCX, TXT, Markdown, CSV, JSON, XML)")
async def ingest_document(request: Request, document: UploadFile = File(...), textRepresentation: str | None = _TEXT, metadata: str | None = _META,
                    tags: str | None = _TAGS, collectionId: str = _COLL, storePayload: bool = _STORE) -> dict:  # fmt: skip
    return await _ingest(request, "document", "document", document, textRepresentation, metadata, tags, collectionId, storePayload)


@router.post("/multimodal/query", response_model=RagResults, summary="Query assets by text")
def query(body: RagQuery, request: Request) -> dict:
    return request.app.state.assets.query(
        body.query, modalities=body.modalities, collection_ids=body.collectionIds, top_k=body.topK, retrieval_mode=body.retrievalMode
    )


def _query_by_file(request: Request, kind: str, field: str, upload, top_k, collection_ids, modalities, mode) -> dict:
    assets = request.app.state.assets
    with spooled(upload, field, assets.settings.multimodal.max_file_bytes) as (path, filename):
        return assets.query_by_file(kind, path, filename, field=field, top_k=top_k, collection_ids=collection_ids,
                                    modalities=modalities, retrieval_mode=mode)  # fmt: skip


_TOPK = Form(10, ge=1, le=100)
_COLLS = Form(None, max_length=4096, description="a JSON array or comma-separated")
_MODS = Form(None, max_length=256, description="image, audio, document: a JSON array or comma-separated")
_MODE = Form("auto", description="auto | text | native | hybrid")


@router.post("/multimodal/images/query", response_model=RagResults, summary="Query assets by an image")
def query_by_image(request: Request, image: UploadFile = File(...), topK: int = _TOPK, collectionIds: str | None = _COLLS,
                   modalities: str | None = _MODS, retrievalMode: RetrievalMode = _MODE) -> dict:  # fmt: skip
    return _query_by_file(request, "image", "image", image, topK, collectionIds, modalities, retrievalMode)


@router.post("/multimodal/audio/query", response_model=RagResults, summary="Query assets by a recording")
def query_by_audio(request: Request, audio: UploadFile = File(...), topK: int = _TOPK, collectionIds: str | None = _COLLS,
                   modalities: str | None = _MODS, retrievalMode: RetrievalMode = _MODE) -> dict:  # fmt: skip
    return _query_by_file(request, "audio", "audio", audio, topK, collectionIds, modalities, retrievalMode)


@router.get("/multimodal/assets/{assetId}", response_model=Asset, summary="An asset's record, derived text and chunk count")
def get_asset(assetId: str, request: Request) -> dict:
    return request.app.state.assets.get(assetId)


@router.get("/multimodal/assets/{assetId}/content", summary="The stored original bytes (404 unless storePayload was true)",
            response_class=FileResponse, responses={200: {"content": {"application/octet-stream": {}}}})  # fmt: skip
def get_asset_content(assetId: str, request: Request):
    path, mime, name = request.app.state.assets.payload(assetId)
    return FileResponse(path, media_type=mime, filename=name, headers={"X-Content-Type-Options": "nosniff"})


@router.delete("/multimodal/assets/{assetId}", response_model=Deleted, summary="Delete an asset: file, rows and payload")
async def delete_asset(assetId: str, request: Request) -> dict:
    return await request.app.state.memory.run_write(request.app.state.assets.delete, assetId)
