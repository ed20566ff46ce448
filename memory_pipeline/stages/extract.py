"""Stage 2, ``extracted_content``: text segments for every file the manifest marks ``index``.

Takes the manifests (shard -> frame), yields the segments (text with line locators)
one shard at a time, in pieces of whole files (``storage.PIECE_ROWS`` segments), and records beside them the extraction status (ok, failed with a
reason, or ok with a warning when indexed in part). One file's failure, whatever it is,
becomes that file's recorded error; the stage goes on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memory_pipeline import progress, storage
from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction import MediaOptions, extract, shutdown_worker
from memory_pipeline.models import EXTRACTION_STATUS_SCHEMA, SEGMENTS_SCHEMA, frame_of
from memory_pipeline.settings import Settings

if TYPE_CHECKING:
    import polars as pl


@dataclass
class ExtractCounts:
    files: int = 0
    extracted: int = 0
    failed: int = 0
    segments: int = 0
    chars: int = 0
    failures: list[dict] = field(default_factory=list)


def extract_content(settings: Settings, manifests: Mapping[str, pl.DataFrame], counts: ExtractCounts | None = None) -> Iterator[tuple[str, pl.DataFrame]]:
    """Yield ``(shard, segments)`` per shard of ``manifests`` for the files marked ``index``,
    recording each shard's extraction status before its segments; failures are recorded, never raised."""
    import polars as pl

    data = storage.of(settings)
    counts = counts if counts is not None else ExtractCounts()
    options = MediaOptions.from_settings(settings)
    todo = pl.col("action") == "index"
    # A first pass over the (small) manifests, for the progress total: one shard in memory at a time.
    total = sum(manifests[s].filter(todo).height for s in manifests)
    roots = {s.name: s.path for s in settings.sources}
    done = 0
    if total:
        progress.report("extract", 0, total, "files")
    try:
        for shard in manifests:
            seg_rows: list[dict] = []
            status_rows: list[dict] = []
            for row in manifests[shard].filter(todo).iter_rows(named=True):
                counts.files += 1
                _extract_one(row, roots, options, counts, seg_rows, status_rows)
                done += 1
                progress.report("extract", done, total, "files")
                if len(seg_rows) >= storage.PIECE_ROWS:
                    # A piece of whole files: the shard's file is written as it is made.
                    yield shard, frame_of(seg_rows, SEGMENTS_SCHEMA)
                    seg_rows = []
            # Before the shard's last piece: the segments file appears once whole, after its status.
            data.write_rows(status_rows, EXTRACTION_STATUS_SCHEMA, "extracted_content", shard, ".status")
            yield shard, frame_of(seg_rows, SEGMENTS_SCHEMA)
    finally:
        shutdown_worker()  # the media worker (if one was started) ends with the stage


def _extract_one(row: dict, roots: dict, options: MediaOptions, counts: ExtractCounts, seg_rows: list[dict], status_rows: list[dict]) -> None:
    try:
        segments = extract(row["abs_path"], row["modality"], row["mime_type"], options, roots.get(row["source"]))
    except Exception as err:  # noqa: BLE001 - one file's failure, whatever it is, is that file's error
        reason = err.reason if isinstance(err, ExtractionError) else f"extraction failed unexpectedly: {type(err).__name__}: {err}"
        counts.failed += 1
        counts.failures.append({"path": row["abs_path"], "reason": reason})
        status_rows.append({"doc_id": row["doc_id"], "status": "failed", "reason": reason, "segments": 0, "chars": 0})
        return
    counts.extracted += 1
    chars = sum(len(s.text) for s in segments)
    counts.segments += len(segments)
    counts.chars += chars
    warning = getattr(segments, "warning", "")  # indexed in part (a PDF over the page cap)
    status_rows.append({"doc_id": row["doc_id"], "status": "ok", "reason": warning, "segments": len(segments), "chars": chars})
    for i, seg in enumerate(segments):
        seg_rows.append(
            {
                "doc_id": row["doc_id"],
                "seg_index": i,
                "text": seg.text,
                "line_start": seg.line_start,
                "line_end": seg.line_end,
                "label": seg.label,
                "kind": seg.kind,
            }
        )


__all__ = ["ExtractCounts", "extract_content"]
