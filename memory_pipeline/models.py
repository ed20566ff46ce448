"""Records that flow between the stages, and the Arrow schemas of their Parquet files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True)
class Segment:
    """A piece of extracted text with where it came from.

    ``line_start``/``line_end`` are 1-based lines of the source file (for a session
    transcript: the JSONL lines of the message). ``label`` is what the chunker
    prefixes (e.g. ``[2026-11-02 10:15] user:`` for a message).
    """

    text: str
    line_start: int
    line_end: int
    label: str = ""
    # Media: what part of the file this is ("page", "time", "frame", "note", "exif", "ocr",
    # "para", "table", "text"); line_start/line_end then hold pages, milliseconds or ordinals.
    kind: str = ""


@dataclass(frozen=True)
class Chunk:
    """A token-bounded piece of a file, the unit that is embedded and stored."""

    index: int
    text: str
    heading: str
    line_start: int
    line_end: int
    tokens: int
    model_tokens: int = 0  # in the embedding model's own tokenizer, when one was given
    kind: str = ""  # media: the Segment kind of every part of this chunk

    @property
    def embed_text(self) -> str:
        return f"{self.heading}\n{self.text}" if self.heading else self.text


MANIFEST_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("source", pa.string()),
        ("path", pa.string()),
        ("abs_path", pa.string()),
        ("shard", pa.string()),
        ("size", pa.int64()),
        ("mtime_ns", pa.int64()),
        ("inode", pa.int64()),
        ("sha256", pa.string()),
        ("mime_type", pa.string()),
        ("modality", pa.string()),
        ("status", pa.string()),  # ok | skipped | failed
        ("reason", pa.string()),
        ("action", pa.string()),  # index | unchanged | none
        ("walk_status", pa.string()),  # what the stat walk alone said: ok | skipped | failed | kept (not seen: see KEPT)
    ]
)

# ``walk_status`` of a file's last record, carried over while its folder could not be listed (or its
# source folder is missing): the walk did not see it, and its rows are kept.
KEPT = "kept"

DELETIONS_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("path", pa.string())])

SEGMENTS_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("seg_index", pa.int32()),
        ("text", pa.string()),
        ("line_start", pa.int32()),
        ("line_end", pa.int32()),
        ("label", pa.string()),
        ("kind", pa.string()),
    ]
)

EXTRACTION_STATUS_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("status", pa.string()),  # ok | failed
        ("reason", pa.string()),
        ("segments", pa.int32()),
        ("chars", pa.int64()),
    ]
)

CHUNKS_SCHEMA = pa.schema(
    [
        ("chunk_id", pa.string()),
        ("doc_id", pa.string()),
        ("source", pa.string()),
        ("path", pa.string()),
        ("shard", pa.string()),
        ("chunk_index", pa.int32()),
        ("heading", pa.string()),
        ("text", pa.string()),
        ("embed_text", pa.string()),
        ("content_hash", pa.string()),
        ("line_start", pa.int32()),
        ("line_end", pa.int32()),
        ("locator", pa.string()),
        ("tokens", pa.int32()),
        ("modality", pa.string()),
        ("mime_type", pa.string()),
        ("file_sha256", pa.string()),
        ("file_mtime_ns", pa.int64()),
        # Native media embedding: the file whose bytes (with embed_text as the label) make this
        # chunk's vector; "" for every chunk embedded from its text.
        ("media_file", pa.string()),
    ]
)

# Which files' rows are committed to the table, and from which content. Written
# only after the table commit, so a killed run is simply redone on the next one.
INDEXED_STATE_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("sha256", pa.string()),
        ("fingerprint", pa.string()),
        ("chunks", pa.int32()),
    ]
)


def embeddings_schema(dims: int) -> pa.Schema:
    return pa.schema([("content_hash", pa.string()), ("vector", pa.list_(pa.float32(), dims))])


# The Parquet assets and side files by name (their Dagster asset keys): the schema each is written
# in. chunk_embeddings is absent: its vector width is the run's model's (see :func:`asset_schema`).
ASSET_SCHEMAS = {
    "source_files": MANIFEST_SCHEMA,
    "file_deletions": DELETIONS_SCHEMA,
    "extracted_content": SEGMENTS_SCHEMA,
    "extraction_status": EXTRACTION_STATUS_SCHEMA,
    "memory_chunks": CHUNKS_SCHEMA,
    "indexed_state": INDEXED_STATE_SCHEMA,
}


def asset_schema(name: str, frame: pl.DataFrame | None = None) -> pa.Schema | None:
    """The Arrow schema of an asset's files; chunk_embeddings' from its frame's vector width (None without one)."""
    if name != "chunk_embeddings":
        return ASSET_SCHEMAS[name]
    if frame is None or "vector" not in frame.columns:
        return None
    return embeddings_schema(frame.schema["vector"].size)  # pyright: ignore[reportAttributeAccessIssue] - an Array dtype


def frame_of(rows: list[dict], schema: pa.Schema) -> pl.DataFrame:
    """Rows as a polars DataFrame in ``schema``'s types (built through Arrow, like the files are)."""
    import polars as pl

    frame = pl.from_arrow(pa.Table.from_pylist(rows, schema=schema))
    assert isinstance(frame, pl.DataFrame)
    return frame
