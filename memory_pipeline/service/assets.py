"""AgentOS multimodal assets: ingest, look up, delete and query, on top of the memory folder.

An ingested asset becomes files in a source folder (``assets source``, default the first), so
the folder stays the source of truth and `memory index`, Dagster runs and analytics see it like
any other file::

    <source>/agentos/<collectionId>/<assetId>/asset.md            the record (YAML front matter) + derived text
    <source>/agentos/<collectionId>/<assetId>/<name>              the original bytes (storePayload, no textRepresentation)
    <source>/agentos/<collectionId>/<assetId>/.payload/<name>     the original bytes (storePayload with textRepresentation)

``assetId`` is stable: the first 24 hex digits of sha256(collectionId, NUL, bytes), so ingesting
the same file into the same collection again answers the same asset. ``textRepresentation``,
when given, is the derived text: it goes into ``asset.md`` and nothing is captioned, OCRed or
transcribed (a stored payload is kept in the hidden ``.payload`` folder, which the default
excludes keep out of the index). Without it, the derived text is computed: at ingest into
``asset.md`` (OCR, photo details, transcript, page text), or, with ``storePayload``, by the
indexer from the payload like any media file (embedded natively too when ``multimodal.native``
is on).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import yaml

from memory_pipeline.discovery import MEDIA_MODALITIES, doc_id, sniff
from memory_pipeline.errors import ConfigError, ExtractionError, MemoryPipelineError
from memory_pipeline.search.filters import sql_str
from memory_pipeline.service.core import MemoryService, NotFound, TooLarge, Unsupported, native_available
from memory_pipeline.service.files import remove_tree, safe_name, write_file
from memory_pipeline.service.retrieval import plan

ASSETS_DIR = "agentos"
RECORD = "asset.md"
# A payload ingested with its textRepresentation is kept in a hidden folder: the default excludes
# (``**/.*/**``) keep the indexer from captioning, OCRing or transcribing what the caller described.
DESCRIBED = ".payload"
ASSET_ID = re.compile(r"^[0-9a-f]{24}$")
COLLECTION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
AGENTOS_MODALITIES = ("image", "audio", "document")
# What each ingest route takes, by the modality sniffed from the bytes.
ACCEPTS = {
    "image": ("image",),
    "audio": ("audio", "video"),
    "document": ("pdf", "document", "markdown", "text"),
}
MAX_METADATA_BYTES = 64 * 1024
MAX_TAGS = 64


def parse_list(value, *, field: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    """A JSON array or a comma-separated string (or a list already), as a list of strings."""
    if value is None or value == "":
        return []
    items = value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                items = json.loads(text)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{field} is not valid JSON: {err.msg}", key=field) from err
        else:
            items = [p.strip() for p in text.split(",")]
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{field} must be a list of strings (a JSON array or comma-separated)", key=field)
    items = [i.strip() for i in items if i.strip()]
    if allowed is not None:
        bad = [i for i in items if i not in allowed]
        if bad:
            raise ConfigError(f"{field} must be among {', '.join(allowed)}, got {bad[0]!r}", key=field)
    return items


def parse_metadata(value) -> dict:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        if len(value.encode("utf-8", "replace")) > MAX_METADATA_BYTES:
            raise ConfigError(f"metadata is over {MAX_METADATA_BYTES} bytes", key="metadata")
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ConfigError(f"metadata is not valid JSON: {err.msg}", key="metadata") from err
    if not isinstance(value, dict):
        raise ConfigError("metadata must be a JSON object", key="metadata")
    return value


def check_collection(value: str | None) -> str:
    value = "default" if value is None or value == "" else value
    if not isinstance(value, str) or not COLLECTION_ID.match(value):
        raise ConfigError("collectionId must be 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit", key="collectionId")
    return value


class AssetService:
    """The multimodal routes' logic, over one ``MemoryService``."""

    def __init__(self, service: MemoryService, *, source: str | None = None, folder: str = ASSETS_DIR) -> None:
        self.service = service
        self.settings = service.settings
        self.source = self.settings.source(source) if source else self.settings.sources[0]
        self.folder = folder

    # --- ingest ------------------------------------------------------------------------

    def ingest(
        self,
        kind: str,
        upload_path: str,
        filename: str | None,
        *,
        field: str,
        text_representation: str | None = None,
        metadata=None,
        tags=None,
        collection_id: str | None = None,
        store_payload: bool = False,
    ) -> dict:
        """Store one uploaded file as an asset and index it; returns the asset record."""
        limit = self.settings.multimodal.max_file_bytes
        name = safe_name(filename)
        size = os.path.getsize(upload_path)
        if size > limit:
            raise TooLarge(f"File {name} exceeds {limit} bytes limit for embedding")
        if size == 0:
            raise ConfigError(f"{field} is empty", key=field)
        collection = check_collection(collection_id)
        meta = parse_metadata(metadata)
        tag_list = parse_list(tags, field="tags")[:MAX_TAGS]
        if text_representation is not None and not isinstance(text_representation, str):
            raise ConfigError("textRepresentation must be text", key="textRepresentation")
        given_text = (text_representation or "").strip()
        with open(upload_path, "rb") as fh:
            head = fh.read(8192)
        mime, modality = sniff(head, name)
        if modality not in ACCEPTS[kind]:
            raise Unsupported(
                f"{field}: the file is {mime or 'of an unknown type'} ({modality or 'unknown'}), not {'an' if kind == 'image' else 'a'} {kind}", key=field
            )
        if modality in MEDIA_MODALITIES and modality not in self._media_types():
            raise Unsupported(f"{field}: {modality} files are not indexed here (multimodal.types)", key=field)
        asset_id = _asset_id(collection, upload_path)
        if "." not in name:
            name += _extension(mime)
        derived = given_text
        if not store_payload and not derived:
            derived = self._extract(upload_path, name, mime, modality, field)
        record = {
            "assetId": asset_id,
            "modality": kind,
            "mimeType": mime,
            "originalFileName": name,
            "collectionId": collection,
            "tags": tag_list,
            "metadata": meta,
            "storePayload": bool(store_payload),
            "sizeBytes": size,
            "createdAt": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        parts = [self.folder, collection, asset_id]
        with self.service.write_lock:
            shards = set()
            if self._record_path(parts).is_file():
                existing = self._read_record(parts)
                if existing and existing.get("storePayload") == bool(store_payload):
                    return self.describe(existing)  # the same bytes in the same collection: the same asset
                shards |= self._shards(parts)  # the files replaced: their rows go too
                remove_tree(self.source.path, parts)
            try:
                if store_payload:
                    # Described by the caller: kept, not derived again; else indexed like any media file.
                    where = [*parts, DESCRIBED, name] if given_text else [*parts, name]
                    with open(upload_path, "rb") as fh:
                        write_file(self.source.path, where, fh.read(), exclusive=True)
                body = derived if not store_payload else given_text
                write_file(self.source.path, [*parts, RECORD], _record_text(record, body).encode("utf-8"))
            except BaseException:
                remove_tree(self.source.path, parts)
                raise
            shards |= self._shards(parts)
        try:
            run = self.service.index(shards)
        except BaseException:
            with self.service.write_lock:
                remove_tree(self.source.path, parts)
            raise
        prefix = str(Path(self.source.path, *parts))
        failed = [e for e in run.get("errors", []) if os.path.abspath(e["path"]).startswith(prefix + os.sep) and e.get("status") != "partial"]
        if failed:
            with self.service.write_lock:
                remove_tree(self.source.path, parts)
            self.service.index(shards)
            raise Unsupported(f"{field} could not be indexed: {failed[0]['reason']}; nothing was stored", key=field)
        return self.describe(record)

    def _shards(self, parts: list[str]) -> set[str]:
        """The shards of the indexed files in the asset folder ``parts`` (what an index run over them covers)."""
        from memory_pipeline.discovery import is_selected, shard_of

        top = Path(self.source.path, *parts)
        found = set()
        for folder, dirs, files in os.walk(top):  # links are not followed (nor need to be: only names count)
            for name in files + [d for d in dirs if Path(folder, d).is_symlink()]:
                rel = Path(folder, name).relative_to(self.source.path).as_posix()
                if is_selected(rel, self.source):
                    found.add(shard_of(self.source.name, rel))
        return found

    def _media_types(self) -> tuple[str, ...]:
        from memory_pipeline.discovery import indexed_media_types

        return indexed_media_types(self.settings)

    def _extract(self, path: str, name: str, mime: str, modality: str, field: str, *, kinds: tuple[str, ...] | None = None) -> str:
        """The derived text of an uploaded file (OCR, photo details, transcript, page text);
        ``kinds``: only segments of these kinds (a query leaves out the media description)."""
        from memory_pipeline.extraction import MediaOptions, extract

        with tempfile.TemporaryDirectory(prefix="memory-ingest-") as tmp:
            target = os.path.join(tmp, name)
            shutil.copyfile(path, target)
            try:
                segments = extract(target, modality, mime, MediaOptions.from_settings(self.settings), root=tmp)
            except ExtractionError as err:
                raise Unsupported(f"{field}: cannot read the file: {err.reason}", key=field) from err
        return "\n".join(s.text for s in segments if s.text.strip() and (kinds is None or s.kind in kinds)).strip()

    # --- look-ups ----------------------------------------------------------------------

    def _record_path(self, parts: list[str]) -> Path:
        return Path(self.source.path, *parts, RECORD)

    def _read_record(self, parts: list[str]) -> dict | None:
        try:
            text = self._record_path(parts).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        return _parse_record(text)

    def _find(self, asset_id: str) -> list[str]:
        if not isinstance(asset_id, str) or not ASSET_ID.match(asset_id):
            raise NotFound(f"no asset {asset_id!r}", key="assetId")
        base = Path(self.source.path, self.folder)
        if base.is_dir() and not base.is_symlink():
            for coll in sorted(os.listdir(base)):
                if COLLECTION_ID.match(coll) and Path(base, coll, asset_id, RECORD).is_file():
                    return [self.folder, coll, asset_id]
        raise NotFound(f"no asset {asset_id!r}", key="assetId")

    def get(self, asset_id: str) -> dict:
        parts = self._find(asset_id)
        record = self._read_record(parts)
        if record is None:
            raise NotFound(f"no asset {asset_id!r}", key="assetId")
        return self.describe(record)

    def payload(self, asset_id: str) -> tuple[str, str, str]:
        """``(path, mime, name)`` of the stored original bytes; ``NotFound`` when none were stored."""
        parts = self._find(asset_id)
        record = self._read_record(parts) or {}
        name = record.get("originalFileName")
        path = None
        if record.get("storePayload") and isinstance(name, str):
            path = Path(self.source.path, *parts, name)
            if not path.exists():
                path = Path(self.source.path, *parts, DESCRIBED, name)
        if path is None or not isinstance(name, str) or safe_name(name) != name or not path.is_file() or path.is_symlink():
            raise NotFound(f"asset {asset_id} has no stored payload (ingest it with storePayload=true)", key="assetId")
        return str(path), record.get("mimeType") or "application/octet-stream", name

    def delete(self, asset_id: str) -> dict:
        parts = self._find(asset_id)
        before = len(self._rows(parts))
        with self.service.write_lock:
            shards = self._shards(parts)
            removed = remove_tree(self.source.path, parts)
        if not removed:
            raise NotFound(f"no asset {asset_id!r}", key="assetId")
        self.service.index(shards)
        return {"assetId": asset_id, "deleted": True, "rowsDeleted": before - len(self._rows(parts))}

    def describe(self, record: dict) -> dict:
        """The asset record as the routes answer it: the stored fields, the derived text and its chunk count."""
        parts = [self.folder, record["collectionId"], record["assetId"]]
        rows = self._rows(parts)
        payload_doc = doc_id(self.source.name, "/".join([*parts, record.get("originalFileName", "")]))
        payload_rows = [r for r in rows if r["doc_id"] == payload_doc]
        if record.get("storePayload") and payload_rows:
            derived = "\n".join(r["text"] for r in payload_rows)
        else:
            from memory_pipeline.extraction.output import clean_and_redact

            # The record file as written (the text the client sent): redacted as the index's text is,
            # as the query route shows it (it came back with a password in clear).
            derived = clean_and_redact(_body(self._record_path(parts)))
        return {
            **{
                k: record.get(k)
                for k in ("assetId", "modality", "mimeType", "originalFileName", "collectionId", "tags", "metadata", "storePayload", "sizeBytes", "createdAt")
            },
            "derivedText": derived,
            "chunkCount": len(rows),
            "path": str(Path(self.source.path, *parts)),
        }

    def _rows(self, parts: list[str]) -> list[dict]:
        self.service.searcher.invalidate()
        searcher = self.service.searcher.get()
        if searcher.table is None:
            return []
        prefix = doc_id(self.source.name, "/".join(parts) + "/")
        where = f"starts_with(doc_id, {sql_str(prefix)})"
        rows = searcher.table.search().where(where).select(["doc_id", "chunk_index", "text"]).limit(100000).to_list()
        return sorted(rows, key=lambda r: (r["doc_id"], r["chunk_index"]))

    # --- queries -----------------------------------------------------------------------

    def query(
        self,
        text: str,
        *,
        modalities=None,
        collection_ids=None,
        top_k: int = 10,
        retrieval_mode: str = "auto",
        query_file: tuple[str, str] | None = None,
    ) -> dict:
        """Assets matching a text query or a query file, best chunk first, each with its ``assetId``."""
        wanted = parse_list(modalities, field="modalities", allowed=AGENTOS_MODALITIES)
        collections = parse_list(collection_ids, field="collectionIds")
        bad = [c for c in collections if not COLLECTION_ID.match(c)]
        if bad:
            raise ConfigError(f"collectionIds: not a collection id: {bad[0]!r}", key="collectionIds")
        if not isinstance(top_k, int) or not 1 <= top_k <= 100:
            raise ConfigError("topK must be between 1 and 100", key="topK")
        searcher = self.service.searcher.get()
        native = native_available(self.settings, searcher)
        use_text, use_native = plan(retrieval_mode, native)
        media = [query_file] if (query_file and use_native) else None
        query = text if use_text else ""
        if not query.strip() and not media:
            raise ConfigError("nothing to search with: the query is empty" + (" (no text in the file)" if query_file else ""), key="query")
        mode = "vector" if (query_file is None and retrieval_mode == "native") else "hybrid"
        if mode == "vector" and searcher.provider is None:
            raise ConfigError("retrievalMode native needs an embedding provider", key="retrievalMode")
        results = self.service.search(query, max_results=min(top_k * 5, 200), mode=mode, source=self.source.name, path=f"{self.folder}/**", query_media=media)
        out = []
        records: dict[str, dict | None] = {}
        for r in results:
            rel = r.doc_id.split(":", 1)[-1].split("/")
            if len(rel) < 4 or rel[0] != self.folder:
                continue
            coll, aid = rel[1], rel[2]
            if aid not in records:
                records[aid] = self._read_record([self.folder, coll, aid])
            rec = records[aid]
            if rec is None or (collections and coll not in collections) or (wanted and rec.get("modality") not in wanted):
                continue
            out.append({
                "assetId": aid,
                "score": r.score,
                "snippet": r.snippet,
                "locator": r.snippet_locator or r.locator,
                "modality": rec.get("modality"),
                "mimeType": rec.get("mimeType"),
                "originalFileName": rec.get("originalFileName"),
                "collectionId": coll,
                "chunkId": r.chunk_id,
                "path": r.path,
            })  # fmt: skip
            if len(out) >= top_k:
                break
        return {"query": text, "retrievalMode": retrieval_mode, "nativeUsed": bool(media), "results": out}

    def query_by_file(self, kind: str, path: str, filename: str | None, *, field: str, retrieval_mode: str = "auto", **kw) -> dict:
        """Query by an uploaded image or recording, under the ``retrievalMode`` contract."""
        if os.path.getsize(path) == 0:
            raise ConfigError(f"{field} is empty", key=field)
        name = safe_name(filename)
        with open(path, "rb") as fh:
            mime, modality = sniff(fh.read(8192), name)
        if modality not in ACCEPTS[kind] or modality not in MEDIA_MODALITIES:
            raise Unsupported(f"{field}: the file is {mime or 'of an unknown type'}, not {'an' if kind == 'image' else 'a'} {kind}", key=field)
        from memory_pipeline.querying import QUERY_KINDS

        use_text, use_native = plan(retrieval_mode, native_available(self.settings, self.service.searcher.get()))
        # As `memory search --image/--audio`: the description ("Audio recording x.wav (audio/wav, 0:02
        # long)") is no query text: it matches every file, and its digits are identifiers none has.
        text = self._extract(path, name, mime, modality, field, kinds=QUERY_KINDS)[:2000] if use_text else ""
        if use_text and not text and not use_native:
            what = "no text in the image" if kind == "image" else "no speech in the recording"
            raise ConfigError(f"nothing to search with: {what}", key=field, hint="native media queries need native vectors")
        out = self.query(text, retrieval_mode=retrieval_mode, query_file=(path, mime), **kw)
        out["query"] = text
        return out


def _asset_id(collection: str, path: str) -> str:
    h = hashlib.sha256(collection.encode() + b"\0")
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:24]


def _extension(mime: str) -> str:
    import mimetypes

    return mimetypes.guess_extension(mime or "") or ".bin"


def _record_text(record: dict, body: str) -> str:
    front = yaml.safe_dump(record, sort_keys=False, allow_unicode=True).strip()
    title = record["originalFileName"]
    return f"---\n{front}\n---\n# {title}\n\n{body.strip()}\n"


def _parse_record(text: str) -> dict | None:
    if not text.startswith("---\n"):
        return None
    end = text.find("\n---\n", 4)
    if end < 0:
        return None
    try:
        record = yaml.safe_load(text[4:end])
    except yaml.YAMLError:
        return None
    if not isinstance(record, dict) or not ASSET_ID.match(str(record.get("assetId", ""))):
        return None
    return record


def _body(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
    end = text.find("\n---\n", 4)
    body = text[end + 5 :] if text.startswith("---\n") and end >= 0 else text
    lines = body.strip().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(lines).strip()


__all__ = ["AssetService", "ACCEPTS", "ASSETS_DIR", "parse_list", "MemoryPipelineError"]
