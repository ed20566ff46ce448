"""What the server does, without HTTP: search, read lines, write a note, status, index.

Routes (``routes_*``) and MCP tools (``mcp_server``) are thin wrappers over ``MemoryService``;
both raise and translate the same errors. Writes (notes, assets, deletes) change their files under
``write_lock`` and end with an index run over the shards holding those files only (the runner
locks each shard against other processes' runs); searches never take that lock. Index requests
that queue up behind a run are served together by the next one: one run over all their shards.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING

from memory_pipeline.discovery import INDEXED_MODALITIES, doc_id, is_selected, sniff
from memory_pipeline.errors import ConfigError, MemoryPipelineError
from memory_pipeline.service.files import read_head, rel_parts, write_file
from memory_pipeline.service.indexer import IndexWorker
from memory_pipeline.service.warm import WarmSearcher
from memory_pipeline.settings import Settings

if TYPE_CHECKING:
    from memory_pipeline.stages.report import RunSummary

MAX_LINES = 2000
# Writes run in worker threads of their own, at most this many at once: a burst of writes queued on
# ``write_lock`` then waits in the event loop, not in the 40 threads searches and health checks share
# (42 queued notes held them all: a search took 12 s). More than one, so that writes queued behind an
# index run still append their files and share the next run.
WRITE_THREADS = 8
FOLD_AFTER_SECONDS = 2.0  # quiet time after the last write before its rows are folded into the indices
FOLD_MAX_WAIT_SECONDS = 60.0  # writes that never pause are folded this often (each fold adds a delta vector index)
FOLD_MIN_INTERVAL_SECONDS = 30.0  # and no fold comes sooner than this after the last (bursts a few seconds apart)
log = logging.getLogger(__name__)
NOTE_SUFFIXES = (".md", ".markdown", ".txt")


class NotFound(MemoryPipelineError):
    """The thing asked for does not exist (HTTP 404); ``key`` names the field that named it."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class Unsupported(MemoryPipelineError):
    """A file of a kind this call does not take (HTTP 415); ``key`` names the field."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class TooLarge(MemoryPipelineError):
    """Over ``multimodal.max_file_bytes`` (HTTP 413), with the message `memory store` prints."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key


@dataclass(eq=False)
class _IndexRequest:
    """One caller's wish for an index run over ``shards`` (None: every shard), and what came of it."""

    shards: frozenset[str] | None
    summary: RunSummary | None = None
    error: BaseException | None = None


class MemoryService:
    """The memory folder and its index, as one long-lived object (settings, warm searcher, write lock)."""

    def __init__(self, settings: Settings, *, refresh_seconds: float = 0.25, fold_after_seconds: float = FOLD_AFTER_SECONDS, index_worker: bool = True) -> None:
        self.settings = settings
        from memory_pipeline.discovery import keep_name_checks

        keep_name_checks()  # its runs and ingests walk the folder again and again
        self.searcher = WarmSearcher(settings, refresh_seconds=refresh_seconds)
        self.write_lock = threading.Lock()
        self._queue: list[_IndexRequest] = []  # index requests waiting for the write lock
        self._queue_lock = threading.Lock()
        self.started = time.time()
        self.ready = False
        self.warm_error = ""  # why the searcher could not be opened, for /readyz
        self.last_index: RunSummary | None = None
        self.fold_after_seconds = fold_after_seconds
        self.last_fold: dict = {}
        self._writes = 0  # index runs served so far; the fold thread waits for it to stop moving
        self._wrote = threading.Condition()
        self._closed = False
        self._folder: threading.Thread | None = None
        self._last_fold_at = float("-inf")
        # Index runs in a companion process (``service.indexer``), so their Python work never
        # holds this process's interpreter lock while it searches; in-process without it.
        self._worker = IndexWorker(settings) if index_worker else None
        self._write_limiter = None  # made on first use, inside the event loop that serves the writes

    async def run_write(self, fn, /, *args, **kwargs):
        """``fn(*args, **kwargs)`` (a write: it takes ``write_lock``) in one of ``WRITE_THREADS``
        threads kept for writes, so that writes waiting on each other never starve searches."""
        import functools

        import anyio.to_thread

        if self._write_limiter is None:
            self._write_limiter = anyio.CapacityLimiter(WRITE_THREADS)
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self._write_limiter)

    # --- reads -------------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        max_results: int | None = None,
        min_score: float | None = None,
        mode: str = "hybrid",
        fusion: str | None = None,
        source: str | None = None,
        path: str | None = None,
        types: list[str] | None = None,
        modality: list[str] | None = None,
        since: date | None = None,
        until: date | None = None,
        mmr: bool | None = None,
        mmr_lambda: float | None = None,
        recency_half_life_days: float | None = None,
        query_media: list[tuple[str, str]] | None = None,
    ) -> list:
        """``SearchResult`` rows, exactly as `memory search` computes them."""
        from memory_pipeline.search import SearchFilters

        searcher = self.searcher.get()
        filters = SearchFilters(
            source=source or None,
            modality=tuple(modality or ()),
            path_glob=path or None,
            since=since,
            until=until,
            types=tuple(types or ()),
        )
        opts = searcher.options(
            max_results=max_results, min_score=min_score, mode=mode, fusion=fusion, mmr=mmr, mmr_lambda=mmr_lambda,
            recency_half_life_days=recency_half_life_days, filters=filters, query_media=query_media,
        )  # fmt: skip
        return searcher.search(query, opts)

    def search_files(self, query: str, files: list[tuple[str, str, str]], *, retrieval_mode: str = "auto", **options) -> tuple[str, list]:
        """`memory search --image/--audio` on files ``(path, image|audio, name)``: ``(the query searched, results)``.

        The same steps as the command line: each file's derived text (OCR, photo details,
        transcript) is added to ``query`` and/or its bytes embedded natively, under the
        ``retrievalMode`` contract; then :meth:`search` with ``options``.
        """
        from memory_pipeline.querying import derived_query_text, query_file
        from memory_pipeline.service.retrieval import plan

        native = self.settings.multimodal.native and self.settings.multimodal.enabled
        use_text, use_native = plan(retrieval_mode, native, field="retrieval_mode")
        texts = [derived_query_text(path, kind, self.settings, allow_empty=native, name=name) for path, kind, name in files] if use_text else []
        media = [query_file(path, kind, self.settings, name=name)[:2] for path, kind, name in files] if use_native else []
        searched = " ".join(p for p in (query, *texts) if p and p.strip())
        if not searched and not media:
            raise ConfigError("give a query, an image or a recording", key="image")
        return searched, self.search(searched, query_media=media, **options)

    def locate(self, path: str, source: str | None = None) -> tuple[str, str, str]:
        """``(source name, relative path, absolute path)`` of a file named by an agent, inside a source folder.

        ``path`` is absolute (as search results give it) or relative to ``source`` (default: the
        first source holding it). Anything outside every source folder is refused.
        """
        if not isinstance(path, str) or not path.strip() or "\x00" in path:
            raise ConfigError("path must name a file inside a source folder", key="path")
        sources = [self._asked_source(source)] if source else list(self.settings.sources)
        if os.path.isabs(path):
            literal = os.path.abspath(path)
            for s in sources:
                for root in (os.path.abspath(s.path), os.path.realpath(s.path)):
                    if literal.startswith(root.rstrip(os.sep) + os.sep):
                        rel = os.path.relpath(literal, root).replace(os.sep, "/")
                        rel_parts(rel, field="path")
                        return s.name, rel, literal
            raise ConfigError(f"path {path!r} is not inside a source folder", key="path")
        parts = rel_parts(path, field="path")
        rel = "/".join(parts)
        for s in sources:
            candidate = os.path.join(os.path.abspath(s.path), *parts)
            if os.path.lexists(candidate):
                return s.name, rel, candidate
        raise NotFound(f"no file {path!r} in {'source ' + repr(source) if source else 'any source folder'}", key="path")

    def get_lines(self, path: str, *, start: int = 1, lines: int | None = None, source: str | None = None) -> dict:
        """Lines ``start``… of a text file inside a source folder (what an agent reads after a search hit)."""
        from memory_pipeline.safeio import UnsafeFileError, open_file

        if start < 1:
            raise ConfigError("from must be 1 or more", key="from")
        count = MAX_LINES if lines is None else lines
        if count < 1 or count > MAX_LINES:
            raise ConfigError(f"lines must be between 1 and {MAX_LINES}", key="lines")
        name, rel, abs_path = self.locate(path, source)
        root = self.settings.source(name).path
        try:
            with open_file(abs_path, root) as f:
                if f.size > self.settings.limits.max_file_bytes:
                    raise Unsupported(f"{rel} is {f.size} bytes, over limits.max_file_bytes", key="path")
                data = f.pread(f.size)
        except UnsafeFileError as err:
            raise ConfigError(f"path {path!r} refused: {err.reason}", key="path") from err
        except FileNotFoundError as err:
            raise NotFound(f"no file {path!r}", key="path") from err
        except IsADirectoryError as err:
            raise ConfigError(f"path {path!r} is a folder", key="path") from err
        except OSError as err:
            raise ConfigError(f"path {path!r} cannot be read: {err.strerror or err}", key="path") from err
        _, modality = sniff(data[:4096], rel)
        if modality not in INDEXED_MODALITIES:
            raise Unsupported(
                f"{rel} is a {modality or 'binary'} file, not text; its derived text is in search results "
                "(and its note, if any, in FILE.note.md)", key="path",
            )  # fmt: skip
        from memory_pipeline.extraction.output import clean_and_redact

        # Cleaned and redacted as the index's text is (the whole file: a key block may start above
        # the lines asked for), and cut into lines as the chunker counts them: at "\n" only, a
        # carriage return being one. Redacted raw, a file with CR or CRLF line ends kept `.pgpass`
        # lines whole (their detector needs a line start) and a key with a control character inside
        # it (which cleaning removes before the index redacts) came back in clear; `splitlines`
        # also cut at form feeds, NEL and U+2028, so line numbers disagreed with search locators.
        text = clean_and_redact(data.decode("utf-8", errors="replace"))
        all_lines = text.split("\n")
        if all_lines and all_lines[-1] == "":
            all_lines.pop()  # the break that ends the last line
        chosen = all_lines[start - 1 : start - 1 + count]
        return {
            "path": abs_path,
            "source": name,
            "doc_id": doc_id(name, rel),
            "from": start,
            "to": start + len(chosen) - 1 if chosen else start - 1,
            "total_lines": len(all_lines),
            "truncated": start - 1 + count < len(all_lines),
            "text": "\n".join(chosen),
        }

    def status(self) -> dict:
        """Provider, table, sources and last run, as an agent needs them (a light `memory status`)."""
        from memory_pipeline.runner import last_run
        from memory_pipeline.stores import generations

        searcher = self.searcher.get()
        table = searcher.table
        run = last_run(self.settings) or {}
        provider = searcher.provider
        return {
            "ready": self.ready,
            "uptime_seconds": round(time.time() - self.started, 1),
            "config": str(self.settings.config_path or ""),
            "data_dir": str(self.settings.data_dir),
            "provider": provider.name if provider else "none",
            "model": getattr(provider, "model", None) if provider else None,
            "dims": searcher.dims,
            "native_media": native_available(self.settings, searcher),
            "table": {
                "name": searcher.store.table_name,
                "exists": table is not None,
                "rows": table.count_rows() if table is not None else 0,
                "version": table.version if table is not None else None,
            },
            "generations": generations.describe(self.settings),
            "sources": [{"name": s.name, "path": str(s.path)} for s in self.settings.sources],
            "last_run": {k: v for k, v in run.items() if k != "errors"} | ({"errors": len(run.get("errors", []))} if run else {}),
            "last_fold": self.last_fold,  # new rows folded into the indices once writes settle
            "fold_pending": self.fold_pending,
            "index_worker_pid": self._worker.pid if self._worker is not None else None,
        }

    # --- writes ------------------------------------------------------------------------

    def index(self, shards: Iterable[str] | None = None) -> RunSummary:
        """An index run over ``shards`` (default: every shard), serialized with the server's other writes.

        Call it after the files are written: a request queued while another run works is served
        by the next run, which takes every queued request's shards at once (the same summary for
        each). Raises the run's error for every request it served.
        """
        from memory_pipeline.stages.report import RunSummary

        request = _IndexRequest(None if shards is None else frozenset(shards))
        with self._queue_lock:
            self._queue.append(request)
        with self.write_lock:
            if request.summary is None and request.error is None:  # no run took it while this one waited
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                wanted = None if any(r.shards is None for r in batch) else frozenset().union(*(r.shards or () for r in batch))
                try:
                    summary = None if wanted == frozenset() else self._run_index(wanted)
                except BaseException as err:  # noqa: BLE001 - handed to every request of the batch, raised below
                    for r in batch:
                        r.error = err
                else:
                    for r in batch:
                        r.summary = summary
                self.searcher.invalidate()
                if summary is not None:
                    self.last_index = summary
                    self._refresh_runs()
                    if summary.rows_written or summary.rows_deleted:
                        self._fold_later()
        if request.error is not None:
            raise request.error
        return request.summary or RunSummary(skipped_run=True)  # no shard to run: nothing to index

    def _run_index(self, shards: frozenset[str] | None) -> RunSummary:
        if self._worker is not None:
            return self._worker.run(shards)
        from memory_pipeline.runner import run_index

        return run_index(self.settings, shards=shards, keep_model=True)

    # --- folding new rows into the indices once writes settle ----------------------------

    def _fold_later(self) -> None:
        """Fold the rows this server wrote into the table's indices once no write has come for
        ``fold_after_seconds``: each ingest leaves its rows unindexed and its own fragment, which
        every query then scans (see ``VectorStore.fold_new_rows``); folding after each ingest
        instead would add about 1.5 s to each at 100k chunks."""
        if self.fold_after_seconds <= 0:
            return
        with self._wrote:
            self._writes += 1
            self._wrote.notify_all()
            if self._folder is None or not self._folder.is_alive():
                self._folder = threading.Thread(target=self._fold_when_settled, name="memory-fold", daemon=True)
                self._folder.start()

    def _fold_when_settled(self) -> None:
        since = time.monotonic()  # the oldest write not folded yet
        while True:
            with self._wrote:
                seen = self._writes
                moved = self._wrote.wait_for(lambda seen=seen: self._closed or self._writes != seen, timeout=self.fold_after_seconds)
                if self._closed:
                    return
                if moved and time.monotonic() - since < FOLD_MAX_WAIT_SECONDS:
                    continue  # another write: the quiet interval starts again (writes that never pause still get folded)
            rest = FOLD_MIN_INTERVAL_SECONDS - (time.monotonic() - self._last_fold_at)
            if rest > 0:
                with self._wrote:
                    if self._wrote.wait_for(lambda: self._closed, timeout=rest):
                        return
            with self.write_lock:
                with self._wrote:
                    if self._closed:
                        return
                    seen = self._writes  # every write so far is in the table: this fold covers them
                self.fold_now()
                self._last_fold_at = time.monotonic()
            with self._wrote:
                if self._writes == seen:
                    self._folder = None
                    return
            since = time.monotonic()

    @property
    def fold_pending(self) -> bool:
        """A fold is waiting for writes to settle, or under way."""
        folder = self._folder
        return folder is not None and folder.is_alive()

    def fold_now(self) -> dict:
        """Fold new rows into the current table's indices now (under the write lock); what was done."""
        from memory_pipeline.service.indexer import fold

        try:
            # In the worker: at its priority, off this process's interpreter lock.
            done = self._worker.fold() if self._worker is not None else fold(self.settings)
            self.last_fold = done | {"at": time.time()}
        except Exception as err:  # noqa: BLE001 - searches still work (scanning); the next settle tries again
            log.warning("could not fold new rows into the indices: %s", err)
            self.last_fold = {"fold": "failed", "error": str(err), "at": time.time()}
        self.searcher.invalidate()
        return self.last_fold

    def close(self) -> None:
        """Stop the fold thread (a fold under way finishes) and the index worker."""
        with self._wrote:
            self._closed = True
            self._wrote.notify_all()
        if self._worker is not None:
            self._worker.close()

    def _refresh_runs(self) -> None:
        from memory_pipeline.stores.analytics import refresh_runs

        try:
            refresh_runs(self.settings)
        except Exception:  # noqa: BLE001 - the index is fine; only the analytics copy of `runs` lags
            pass

    def _asked_source(self, name: str):
        """The source a request names; an unknown one is an error naming the request's field
        (``source``), not the configuration's (``sources``)."""
        try:
            return self.settings.source(name)
        except ConfigError as err:
            raise ConfigError(str(err), key="source", hint=f"one of: {', '.join(s.name for s in self.settings.sources)}") from None

    def write_note(self, text: str, *, path: str | None = None, source: str | None = None, append: bool = True, index: bool = True) -> dict:
        """Write (or append to) a markdown note in a source folder and index it.

        Default file: ``memory/YYYY-MM-DD.md`` (today, UTC) in the first source, appended to.
        A note the index would not take (a secret in the file's name, a file pushed over
        ``limits.max_file_bytes``, text that makes the file read as binary) is refused before
        anything is written; one the run still could not index answers ``indexed: false`` and why.
        """
        from memory_pipeline.discovery import SNIFF_BYTES
        from memory_pipeline.extraction.redact import redact

        if not isinstance(text, str) or not text.strip():
            raise ConfigError("text must not be empty", key="text")
        if "\x00" in text:
            # A NUL in the first 8 KiB makes the whole file read as binary: never indexed again.
            raise ConfigError("text holds a NUL character; notes are text", key="text", hint=ConfigError.NO_HINT)
        src = self._asked_source(source) if source else self.settings.sources[0]
        rel = path or f"memory/{datetime.now(UTC).date().isoformat()}.md"
        parts = rel_parts(rel, field="path")
        if not parts[-1].lower().endswith(NOTE_SUFFIXES):
            raise ConfigError(f"path must end with {', '.join(NOTE_SUFFIXES)}: {rel!r}", key="path")
        rel = "/".join(parts)
        if not is_selected(rel, src):
            raise ConfigError(f"{rel} is excluded by the include/exclude globs of source {src.name!r}", key="path")
        shown, secrets = redact(rel)
        if secrets:  # the walk would skip the file (discovery._secret_in_name): a note never found
            raise ConfigError(f"path {shown!r} holds what looks like a secret; such files are not indexed", key="path", hint="choose another file name")
        try:
            encoded = (text.strip() + "\n").encode("utf-8")
        except UnicodeEncodeError as err:
            raise ConfigError("text is not valid Unicode (a lone surrogate)", key="text", hint=ConfigError.NO_HINT) from err
        limit = self.settings.limits.max_file_bytes
        with self.write_lock:
            try:
                size, head = read_head(src.path, parts, SNIFF_BYTES)
            except OSError as err:
                raise ConfigError(f"cannot write {rel}: {'a link is in the way' if err.errno == 40 else err.strerror or err}", key="path") from err
            data = (b"\n" + encoded) if append and size > 0 else encoded
            total = size + len(data) if append else len(data)
            if total > limit:
                raise TooLarge(
                    f"{rel} would be {total} bytes, over limits.max_file_bytes={limit} (files over it are not indexed); "
                    "nothing was written: write to another file",
                    key="text",
                )
            if append and size > 0 and sniff(head, rel)[1] not in INDEXED_MODALITIES:
                raise Unsupported(f"{rel} is not a text file (it reads as binary); nothing was written", key="path")
            after = (head + data)[:SNIFF_BYTES] if append else data[:SNIFF_BYTES]
            if sniff(after, rel)[1] not in INDEXED_MODALITIES:
                # Text that begins like a PDF, GIF, MP4… (``%PDF-``, ``GIF89a``, ``....ftyp``) at the
                # start of a file makes it read as that, and the file is not indexed.
                raise ConfigError(f"text would make {rel} read as binary or media ({sniff(after, rel)[0]}), not text", key="text", hint=ConfigError.NO_HINT)
            try:
                written = write_file(src.path, parts, data, append=append)
            except (NotADirectoryError, IsADirectoryError, FileExistsError) as err:
                raise ConfigError(f"cannot write {rel}: a folder or file of that name is in the way", key="path") from err
            except OSError as err:
                if err.errno in (40,):  # ELOOP: a link planted where a folder or the note should be
                    raise ConfigError(f"cannot write {rel}: a link is in the way", key="path") from err
                raise
        out = {"path": str(written), "source": src.name, "doc_id": doc_id(src.name, rel), "bytes": len(data), "indexed": False}
        if index:
            from memory_pipeline.runner import shards_of

            run = self.index(shards_of([(src.name, rel)]))
            out["run"] = {k: run.get(k) for k in ("files_changed", "chunks_total", "rows_written", "table_rows", "shards")}
            mine = os.path.abspath(written)
            failed = [e for e in run.get("errors", []) if os.path.abspath(e["path"]) == mine and e.get("status") != "partial"]
            out["indexed"] = not failed
            if failed:
                out["reason"] = f"{failed[0]['status']}: {failed[0]['reason']}"
        return out


def native_available(settings: Settings, searcher) -> bool:
    """Whether this index has native media vectors (and can embed a query file natively)."""
    mm = settings.multimodal
    return bool(mm.native and mm.enabled and searcher.provider is not None and getattr(searcher.provider, "supports_multimodal", False))
