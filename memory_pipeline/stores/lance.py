"""The LanceDB table agents search: schema, per-file replace in one commit, FTS.

Each changed file's rows are replaced atomically: one ``merge_insert`` keyed by
``chunk_id`` inserts the new chunks and deletes the rows of those files that are
no longer produced, in a single Lance commit. Concurrent writers (parallel
partition runs) retry on commit conflicts.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pyarrow as pa

from memory_pipeline.allocator import trim_heap
from memory_pipeline.errors import IndexMismatchError, StoreError

log = logging.getLogger(__name__)

# Lance's full-text index builder holds up to LANCE_FTS_PARTITION_SIZE MiB of postings per worker
# before it writes them out as a partition (2,048 MiB by default in the pinned version), so its
# memory grew with the table: building the chunk index of a million generated chunks alone grew a
# process by 281 MB (100k chunks: 76 MB). With 32 MiB a build holds at most that much postings
# and writes the rest out as further partitions: +142 MB at a million (five partitions; a query
# searches all of them with global BM25 statistics: p50 10.1 -> 10.9 ms), +71 MB at 100k (one
# partition, as before). The builds run in one worker with the whole budget, so the partitions do
# not depend on the machine's cores. Read by Lance at its first index build (``optimize``'s folds
# of new rows included), so set on import; a value in the environment wins.
FTS_BUILD_MIB = "32"
os.environ.setdefault("LANCE_FTS_PARTITION_SIZE", FTS_BUILD_MIB)


def fts_build_mib() -> int:
    """The full-text build's postings budget in MiB (LANCE_FTS_PARTITION_SIZE, else FTS_BUILD_MIB)."""
    try:
        return max(1, int(os.environ.get("LANCE_FTS_PARTITION_SIZE", FTS_BUILD_MIB)))
    except ValueError:
        return int(FTS_BUILD_MIB)


FTS_COLUMN = "search_text"
# The whole document's text on one row per document (its first chunk), empty on the others: BM25 over
# it has document-level statistics (term frequencies add up across chunks, length is the file's),
# so chunking does not dilute a document's full-text evidence. Empty rows do not count in LanceDB's
# BM25 statistics (neither in the number of documents nor in the average length). Empty, not null:
# Lance 0.40 reads a page holding one long text among nulls back as that text repeated on every
# row ("Offset overflow" past 2 GiB, so a 5 MB note broke the full-text index); null is left
# for "not filled yet" (a table written before this column, see lacks_document_text).
DOC_FTS_COLUMN = "doc_search_text"
META_KEY = b"memory_pipeline"
# The Lance file format new tables are written in. LanceDB 0.40 writes 2.2 by default, whose small
# columns (integers, short strings) cost a random-access read a fixed 1.5-3 ms of CPU each, growing
# with the table: a search's take of its results' rows (6 rows, 15 columns) took 19.8 ms of CPU at
# a million chunks, 4.4 ms at 100k. The same million rows in 2.1: 3.5 ms (2.0: 4.6 ms), and 80 MB
# on disk against 74 MB (2.0: 309 MB). A table keeps the format it was created in (compaction,
# later writes and ``memory index --force`` included); a new table (generation) gets this one.
DATA_STORAGE_VERSION = "2.1"
_DOCS_PER_COMMIT = 500
_COMMIT_RETRIES = 8


def table_schema(dims: int, meta: dict) -> pa.Schema:
    fields = [
        pa.field("chunk_id", pa.string(), nullable=False),
        pa.field("doc_id", pa.string()),
        pa.field("source", pa.string()),
        pa.field("path", pa.string()),
        pa.field("shard", pa.string()),
        pa.field("chunk_index", pa.int32()),
        pa.field("heading", pa.string()),
        pa.field("text", pa.string()),
        pa.field(FTS_COLUMN, pa.string()),
        pa.field(DOC_FTS_COLUMN, pa.string()),
        pa.field("content_hash", pa.string()),
        pa.field("line_start", pa.int32()),
        pa.field("line_end", pa.int32()),
        pa.field("locator", pa.string()),
        pa.field("tokens", pa.int32()),
        pa.field("modality", pa.string()),
        pa.field("mime_type", pa.string()),
        pa.field("memory_type", pa.string()),
        pa.field("media_type", pa.string()),
        pa.field("original_file_path", pa.string()),
        pa.field("file_sha256", pa.string()),
        pa.field("created_at", pa.timestamp("us", tz="UTC")),
        pa.field("indexed_at", pa.timestamp("us", tz="UTC")),
        pa.field("embedding_model", pa.string()),
    ]
    if dims > 0:
        fields.append(pa.field("vector", pa.list_(pa.float32(), dims)))
    return pa.schema(fields, metadata={META_KEY: json.dumps(meta, sort_keys=True).encode()})


def file_name_words(path: str) -> str:
    """A file's name as words (``2026-11-02_standup.md`` -> ``2026 11 02 standup``): people remember
    "the note from 2026-11-02", so the name is searchable too."""
    return os.path.splitext(os.path.basename(path))[0].replace("-", " ").replace("_", " ")


def join_chunks(texts: Sequence[str], max_overlap: int | None = None) -> str:
    """The text of consecutive chunks with each chunk's overlap with the one before counted once
    (term frequencies must be the document's, not inflated by the chunker's overlap).
    ``max_overlap``: the chunker's overlap in tokens, when known (0: nothing is carried)."""
    out: list[str] = []
    prev = ""
    for text in texts:
        out.append(text[_overlap(prev, text, max_overlap) :])
        prev = text
    return "\n".join(t for t in out if t)


def _overlap(prev: str, text: str, max_overlap: int | None = None) -> int:
    """Where ``text`` goes on after the overlap the chunker carried into it from ``prev`` (0 when
    none). The chunker carries whole lines, or a long line's last words as a line of their own,
    and puts the chunk's new lines after them: so the overlap is a run of ``text``'s first lines
    that ends ``prev`` (less its trailing spaces: "increases \\n" there, "increases\\n" here) and
    starts at a word boundary of it, and a line break follows it in ``text``. The longest such run
    is taken. Nothing else is: words merely repeated at a boundary (a table of "10 10 10", a chunk
    that starts with the words the one before ended with, nothing carried) are the document's
    own. A run that is the whole of ``text`` is not an overlap (a chunk repeated whole is the
    document's own repetition). With ``max_overlap`` the run is the longest whose lines fit it as
    the chunker counts them (each line's tokens and its line break): the chunker carries the most
    trailing lines that fit, so a document repeating its lines at a chunk boundary keeps the
    repeats the chunker did not carry."""
    if not prev or not text or max_overlap == 0:
        return 0
    end = prev.rstrip()
    last = len(text.rstrip())  # text must go on after the run
    best = 0
    at = text.find("\n")
    while 0 <= at < last:
        run = text[:at].rstrip()
        if len(run) > len(end):  # runs only grow: none further can end ``prev``
            break
        if run.strip() and end.endswith(run) and (len(run) == len(end) or end[len(end) - len(run) - 1].isspace()):
            if max_overlap is not None and _line_tokens(run) > max_overlap:
                break  # longer runs do not fit either
            best = at
        at = text.find("\n", at + 1)
    return best


def _line_tokens(run: str) -> int:
    """Tokens of ``run``'s lines as the chunker counts a carried overlap (each line and its break)."""
    from memory_pipeline.chunking import count_tokens_many

    lines = run.split("\n")
    return sum(count_tokens_many(lines)) + len(lines)


def document_texts(doc_ids: Sequence[str], chunk_index: Sequence[int], texts: Sequence[str], paths: Sequence[str], max_overlap: int | None = None) -> list[str]:
    """The ``DOC_FTS_COLUMN`` value of each chunk row: the whole document's text and file name on the
    document's first chunk, empty on the others (see ``DOC_FTS_COLUMN`` for why not null)."""
    order: dict[str, list[int]] = {}
    for i, d in enumerate(doc_ids):
        order.setdefault(d, []).append(i)
    out: list[str] = [""] * len(doc_ids)
    for rows in order.values():
        rows.sort(key=lambda i: chunk_index[i])
        body = join_chunks([texts[i] or "" for i in rows], max_overlap)
        out[rows[0]] = "\n".join(p for p in (body, file_name_words(paths[rows[0]])) if p)
    return out


def _fit(rows: pa.Table, table) -> pa.Table:
    """``rows`` in the table's column order and types (a column added by an upgrade comes last there)."""
    return rows.select(table.schema.names).cast(table.schema)


def _sql_list(values: Sequence[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def _is_conflict(err: Exception) -> bool:
    text = str(err).lower()
    return "conflict" in text or "retryable" in text or "concurrent" in text


# Fragments after which the write stage compacts the table (see ``VectorStore._ensure_fts``).
COMPACT_AT = 16
# Delta vector indices (one per optimize that folded new rows in) past which maintenance and the
# server's folds train the vector index again as one (``VectorStore.ensure_ann``); the server's
# folds only up to ANN_REBUILD_ROWS rows (about a minute of training at 100k chunks; ten at 1M:
# larger tables wait for the nightly maintenance).
ANN_MAX_DELTAS = 8
ANN_REBUILD_ROWS = 250_000
# Rows a write run adds between two folds of its new rows into the vector index (``fold_segment``):
# each fold builds a delta index over just those rows, so a run's index builds hold a segment's
# rows at a time, never the whole table's. Over a million synthetic 384-d vectors committed 4,096
# rows at a time, LanceDB's IVF_HNSW_SQ build over the whole table grew a fresh process by 318 MB
# (200 s); the first build over 65,536 rows by 196 MB and each of the 15 folds by 101-161 MB
# (2026-12-06, ``benchmarks/results-ann-segments-tail-unindexed.json``). Smaller segments fold in
# less memory but leave more deltas, and each costs a query about 1 ms: over 262,144 rows, segments
# of 65,536 / 32,768 / 16,384 rows grew the process by at most 135 / 81 / 62 MB and a vector query
# took 19.1 / 26.6 / 35.1 ms p50 over 4 / 8 / 16 deltas (2026-12-07,
# ``benchmarks/results-ann-segment-size-*.json``); the first build covers ``ann.min_rows`` rows anyway.
SEGMENT_ROWS = 65_536

# LanceDB's caches (index pages, file metadata) of a store that writes, each at most this many MiB.
# Its defaults (6 GiB and 1 GiB) suit a process answering queries; a write run's commits and folds
# read the table's file metadata again and again and the cache kept it: over a 300k-chunk run it
# held 0.5 MB at the first fold and 14.9 MB at the fourth, and a 1M run's floor before each fold
# rose 453 -> 539 MB; bounded, that floor stopped rising at the fifth fold (509 MB; 2026-12-06).
WRITE_CACHE_MIB = 16

# Fragments from which ``VectorStore.fold_new_rows`` compacts a table whose rows are all indexed
# (large tables keep one fragment per ~1M rows after compaction: a few are normal).
FOLD_FRAGMENTS = 4


def unindexed_rows(table) -> int:
    """The most rows any index of ``table``'s checked-out version lacks (queries scan those)."""
    worst = 0
    for idx in table.list_indices():
        stats = table.index_stats(idx.name)
        worst = max(worst, int(getattr(stats, "num_unindexed_rows", 0) or 0))
    return worst


def _fragment_count(table) -> int:
    try:
        return int((table.stats().get("fragment_stats") or {}).get("num_fragments") or 0)
    except (AttributeError, TypeError, ValueError, RuntimeError, OSError):  # older lancedb: no stats
        return 0


def _with_conflict_retry(table, action, what: str):
    """Run ``action()``; on a commit conflict with another writer, back off, reload, try again."""
    for attempt in range(_COMMIT_RETRIES):
        try:
            return action()
        except Exception as err:
            if not _is_conflict(err) or attempt == _COMMIT_RETRIES - 1:
                raise StoreError(f"{what} failed: {err}") from err
            time.sleep(min(0.05 * 2**attempt, 2.0) * (0.5 + random.random()))
            table.checkout_latest()
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass
class WriteCounts:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    commits: int = 0

    def add(self, other: WriteCounts) -> None:
        """Count ``other``'s writes in these."""
        self.inserted += other.inserted
        self.updated += other.updated
        self.deleted += other.deleted
        self.commits += other.commits


class VectorStore:
    """One LanceDB table; ``meta`` (provider, model, dims) is stored in the schema and checked on open."""

    def __init__(self, uri: str, table_name: str, *, cache_mib: int | None = None) -> None:
        """``cache_mib``: bound each of LanceDB's two caches of this store's connection (index pages,
        file metadata) to that many MiB; ``WRITE_CACHE_MIB`` for the stores of a run's writes and of a
        server's folds. None: LanceDB's defaults (6 GiB and 1 GiB), for searches, and for the nightly
        maintenance, whose recall check queries the index (a bounded cache would load it again for
        each query)."""
        self.uri = uri
        self.table_name = table_name
        self.cache_mib = cache_mib
        self._session = None
        self._db = None
        self._table = None

    @property
    def db(self):
        if self._db is None:
            import lancedb

            if "://" in self.uri:
                from memory_pipeline.storage import check_bucket

                check_bucket(self.uri)  # the AWS variables and the bucket checked once, with one-line errors
            if self.cache_mib is None:
                self._db = lancedb.connect(self.uri)
            else:
                size = self.cache_mib * 2**20
                self._session = lancedb.Session(index_cache_size_bytes=size, metadata_cache_size_bytes=size)
                self._db = lancedb.connect(self.uri, session=self._session)
        return self._db

    def cache_bytes(self) -> int | None:
        """What LanceDB's caches of this store's connection hold now (None: unbounded, not tracked)."""
        return None if self._session is None else int(self._session.size_bytes)

    def exists(self) -> bool:
        try:
            return self.table_name in self.db.list_tables().tables
        except AttributeError:  # older list API
            return self.table_name in self.db.table_names()

    def open(self):
        if self._table is None:
            if not self.exists():
                return None
            self._table = self.db.open_table(self.table_name)
        return self._table

    def meta(self) -> dict:
        table = self.open()
        if table is None:
            return {}
        raw = (table.schema.metadata or {}).get(META_KEY)
        return json.loads(raw) if raw else {}

    def dims(self) -> int:
        table = self.open()
        if table is None or "vector" not in table.schema.names:
            return 0
        return table.schema.field("vector").type.list_size

    def ensure(self, dims: int, meta: dict, *, recreate: bool = False):
        """Open the table, creating it; refuse a table built with another model or dimension."""
        if recreate and self.exists():
            self.db.drop_table(self.table_name)
            self._table = None
        table = self.open()
        if table is not None:
            have = self.meta()
            want = {k: meta[k] for k in ("provider", "model", "dims")}
            if {k: have.get(k) for k in want} != want:
                raise IndexMismatchError(
                    f"table {self.table_name} holds {have.get('provider')}/{have.get('model')} vectors "
                    f"({have.get('dims')} dims), config asks for {meta['provider']}/{meta['model']} ({meta['dims']} dims)",
                    hint="run `memory index --force` to rebuild the table with the new model",
                )
            if self.lacks_document_text():
                self.add_document_text()
            return table
        schema = table_schema(dims, meta)
        try:
            self._table = self.db.create_table(self.table_name, schema=schema, exist_ok=True, data_storage_version=DATA_STORAGE_VERSION)
        except Exception as err:
            raise StoreError(f"cannot create table {self.table_name} at {self.uri}: {err}") from err
        return self._table

    def lacks_document_text(self) -> bool:
        """Whether some file of the table has no document text: a table written before
        ``DOC_FTS_COLUMN`` existed, or one whose upgrade (``add_document_text``) was cut short.
        Every file's first chunk row holds one once written (at least its file name, never null)."""
        table = self.open()
        if table is None:
            return False
        if DOC_FTS_COLUMN not in table.schema.names:
            return True
        return table.count_rows(f"chunk_index = 0 AND {DOC_FTS_COLUMN} IS NULL") > 0

    def add_document_text(self) -> int:
        """Upgrade a table written before ``DOC_FTS_COLUMN`` existed: add the column and fill it from
        the table's own chunks, one commit per shard (no file is read or embedded again). Until every
        shard is done, search scores full text per chunk (``MemorySearcher`` checks). Returns the
        rows that got a document text."""
        table = self.open()
        if table is None:
            return 0
        if DOC_FTS_COLUMN not in table.schema.names:
            _with_conflict_retry(table, lambda: table.add_columns(pa.field(DOC_FTS_COLUMN, pa.string())), f"adding {DOC_FTS_COLUMN} to {self.table_name}")
        shards = table.search().select(["shard"]).limit(None).to_arrow().column("shard").unique().to_pylist()
        filled = 0
        for shard in sorted(s for s in shards if s is not None):
            condition = f"shard = {_sql_list([shard])}"
            rows = table.search().where(condition).limit(None).to_arrow()
            if not rows.num_rows:
                continue
            c = rows.select(["doc_id", "chunk_index", "text", "path"]).to_pydict()
            values = document_texts(c["doc_id"], c["chunk_index"], c["text"], c["path"])
            rows = rows.set_column(rows.schema.get_field_index(DOC_FTS_COLUMN), DOC_FTS_COLUMN, pa.array(values, pa.string()))
            part = _fit(rows, table)

            def action(part=part) -> None:
                table.merge_insert("chunk_id").when_matched_update_all().execute(part)

            _with_conflict_retry(table, action, f"filling {DOC_FTS_COLUMN} of {self.table_name}")
            filled += sum(v is not None for v in values)
        # The new column gets an index analysed as the chunk column's is (every row was rewritten,
        # so that one is brought up to date too).
        details = next((getattr(i, "index_details", None) or {} for i in table.list_indices() if list(i.columns) == [FTS_COLUMN]), {})
        fts = SimpleNamespace(language=details.get("language", "English"), stem=details.get("stem", True), ascii_folding=details.get("ascii_folding", True))
        self.ensure_fts(fts)
        return filled

    def replace_docs(self, rows: pa.Table, doc_ids: Sequence[str]) -> WriteCounts:
        """Make the table hold exactly ``rows`` for ``doc_ids``: one commit per batch of files."""
        table = self.open()
        counts = WriteCounts()
        if table is None or not doc_ids:
            return counts
        doc_ids = sorted(set(doc_ids))
        row_docs = rows.column("doc_id").to_pylist() if rows.num_rows else []
        for i in range(0, len(doc_ids), _DOCS_PER_COMMIT):
            batch = doc_ids[i : i + _DOCS_PER_COMMIT]
            wanted = set(batch)
            mask = pa.array([d in wanted for d in row_docs], type=pa.bool_())
            part = rows.filter(mask) if rows.num_rows else rows
            condition = f"doc_id IN ({_sql_list(batch)})"
            self._commit_with_retry(table, part, condition, counts)
        return counts

    def replace_shard(self, parts: Iterable[pa.Table], shard: str) -> WriteCounts:
        """Make the table hold exactly the rows of ``parts`` for a whole shard (the repair path of a
        forced run).

        Two commits back to back (delete, then add): this also clears rows no per-file replace can
        reach, such as duplicated chunk ids or rows of files the index has lost track of. The parts
        (the write stage builds them a slice of files at a time, so the rows' Python lists are never
        a whole shard's) are all made before the delete: the shard is without rows only between
        the two commits.
        """
        table = self.open()
        if table is None:
            raise StoreError(f"table {self.table_name} is missing; run `memory index --force`")
        condition = f"shard = {_sql_list([shard])}"
        made = [p for p in parts if p.num_rows]
        rows = pa.concat_tables(made) if made else None

        def action() -> WriteCounts:
            before = table.count_rows(condition)
            if before:
                table.delete(condition)
            if rows is not None:
                table.add(_fit(rows, table))
            inserted = rows.num_rows if rows is not None else 0
            return WriteCounts(inserted=inserted, deleted=before, commits=int(bool(before)) + int(bool(inserted)))

        return _with_conflict_retry(table, action, f"write to {self.table_name}")

    def _commit_with_retry(self, table, part: pa.Table, condition: str, counts: WriteCounts) -> None:
        def action() -> WriteCounts:
            before = table.count_rows(condition)
            if part.num_rows == 0:
                if before:
                    table.delete(condition)
                return WriteCounts(deleted=before, commits=1)
            if not before:
                # Files the table does not hold yet (a first run, new notes): a plain append. A merge
                # would join against the whole table, in time and memory that grow with it.
                table.add(_fit(part, table))
                return WriteCounts(inserted=part.num_rows, commits=1)
            result = (
                table.merge_insert("chunk_id")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .when_not_matched_by_source_delete(condition)
                .execute(_fit(part, table))
            )
            return WriteCounts(result.num_inserted_rows, result.num_updated_rows, result.num_deleted_rows, 1)

        counts.add(_with_conflict_retry(table, action, f"write to {self.table_name}"))

    def ensure_fts(self, fts=None, *, rebuild: bool = False, fold: bool = False) -> dict:
        """Create the FTS index when missing (or ``rebuild``); fold new rows into it once many are unindexed.

        The B-tree indices on ``KEY_COLUMNS`` are made here too, when missing (the same upkeep,
        after the same writes).

        LanceDB's FTS also scans rows not yet indexed, so new rows are found by text at once.
        ``fts`` is the ``FtsConfig`` (stemming, language, accent folding); a changed config
        takes effect when the index is rebuilt (``memory index --force``).
        Parallel partition runs may race to do this: a commit conflict is retried.
        """
        table = self.open()
        if table is None:
            return {}
        return _with_conflict_retry(table, lambda: self._ensure_fts(fts, rebuild, fold), f"updating the full-text index of {self.table_name}")

    def _ensure_fts(self, fts, rebuild: bool, fold: bool = False) -> dict:
        from lancedb.index import FTS

        table = self.open()
        if table is None:
            return {}
        indices = {idx.name: idx for idx in table.list_indices()}
        created = False
        compacted = 0
        # A first build over many fragments compacts them first: merged after the full-text index
        # exists, the index is remapped to the new row addresses, which loads each of its partitions
        # whole. Alone on 53,248 rows of long notes in 32 fragments, index then compaction peaked at
        # 285 MB (212 at 17,748 rows) in 11.6 s, compaction then index at 238 MB (209) in 8.8 s.
        first = [c for c in (FTS_COLUMN, DOC_FTS_COLUMN) if c in table.schema.names and f"{c}_idx" not in indices]
        if first and (before := _fragment_count(table)) >= COMPACT_AT and table.count_rows():
            table.optimize()
            compacted = before
        # One index per full-text column, the same analysis for both (chunk and document scores must
        # see the same words); the document column is indexed where the table has it.
        for column in (FTS_COLUMN, DOC_FTS_COLUMN):
            if column not in table.schema.names:
                continue
            name = f"{column}_idx"
            # An index built without token positions cannot answer quoted phrases: rebuild it once.
            positions = name not in indices or bool((getattr(indices[name], "index_details", None) or {}).get("with_position", False))
            if name not in indices or rebuild or not positions:
                if table.count_rows() == 0:
                    return {"fts": "empty"}
                table.create_index(
                    column,
                    config=FTS(
                        with_position=True,  # phrase queries ("duty manager") need token positions
                        base_tokenizer="icu",
                        language=getattr(fts, "language", "English"),
                        stem=getattr(fts, "stem", True),
                        remove_stop_words=False,
                        ascii_folding=getattr(fts, "ascii_folding", True),
                        # bounded build memory whatever the table's size (see FTS_BUILD_MIB)
                        memory_limit=fts_build_mib(),
                        num_workers=1,
                    ),
                    replace=True,
                    name=name,
                )
                created = True
        _ensure_key_indices(table, indices)
        # Every commit adds a fragment, and a query opens each one: a table written by many small
        # runs (or shards) answers several times slower than the same rows in one fragment. Once
        # COMPACT_AT fragments have piled up they are merged (and the indices updated) in one
        # optimize: the table is rewritten once per COMPACT_AT runs at most, not once per run.
        if not compacted and (before := _fragment_count(table)) >= COMPACT_AT:
            table.optimize()
            compacted = before
        if compacted:
            return {"fts": "created" if created else "optimized", "compacted_fragments": compacted}
        # Rows replaced since an index was built are scanned, not indexed: fold them in once many
        # are, or at once (``fold``) when a server's searches would pay for them meanwhile: each
        # fragment of unindexed rows cost a hybrid search about 3 ms of CPU at 100k chunks (80 rows
        # in 1, 2, 4 fragments: +3.3, +5.0, +12.4 ms), a fold 1.5 s once, on the writer's CPU.
        # A server waits out a version any of whose indices lacks rows (``service/warm.py``), so a
        # fold for it looks at every index: after a rebuilt full-text index the key and vector
        # indices may still lack a forced run's rows.
        if fold and unindexed_rows(table):
            table.optimize()
            return {"fts": "created" if created else "optimized"}
        unindexed = 0
        for column in (FTS_COLUMN, DOC_FTS_COLUMN):
            stats = table.index_stats(f"{column}_idx") if column in table.schema.names else None
            if stats is not None and stats.num_unindexed_rows > max(2000, stats.num_indexed_rows // 10):
                table.optimize()
                return {"fts": "created" if created else "optimized"}
            unindexed = max(unindexed, getattr(stats, "num_unindexed_rows", 0) or 0)
        if created:
            return {"fts": "created"}
        return {"fts": "current", "unindexed_rows": unindexed}

    def fold_new_rows(self) -> dict:
        """Fold rows not yet in the indices into them, and merge small fragments, in one
        ``optimize``; nothing when every row is indexed and the table has few fragments.

        Each query scans the rows its indices lack (and opens every fragment): on a 100k-chunk
        table, 133 rows written by a few ingests raised a hybrid search's CPU from 29.6 to 47.8 ms,
        while the optimize that folds them took 1.5 s once. The write stage folds only past a
        large backlog (a run's own cost); the server calls this when its writes settle.
        """
        table = self.open()
        if table is None:
            return {}
        unindexed = unindexed_rows(table)
        fragments = _fragment_count(table)
        if not unindexed and fragments < FOLD_FRAGMENTS:
            return {"fold": "current"}
        self._fold(table)
        return {"fold": "optimized", "unindexed_rows": unindexed, "fragments": fragments}

    def _fold(self, table) -> None:
        """Fold the rows the indices lack into them, and merge small fragments: one ``optimize``,
        retried on a commit conflict with another writer."""
        _with_conflict_retry(table, lambda: table.optimize(), f"folding new rows into the indices of {self.table_name}")

    def fold_segment(self, ann, *, retrain: bool = False) -> dict:
        """Index the rows written so far: the write stage calls this after each SEGMENT_ROWS rows it
        added and, while the table has no vector index, as soon as it holds ``ann.min_rows`` rows
        (``stages.write._Segments``). The vector index is built once the table holds them; after that the
        rows it lacks are folded in by ``optimize`` as a delta index over just them (with
        compaction, the other indices folded too), so no build holds more than about a segment's rows
        on top of what the index had, however many rows the run adds. Before the first build, the
        table's fragments are merged and the heap trimmed. Nothing below ``ann.min_rows`` or without
        vectors, and nothing for ``retrain`` (a forced run, which replaces every row and trains the
        index again at its end) into a table that has its full-text index."""
        table = self.open()
        if table is None or "vector" not in table.schema.names or table.count_rows() < ann.min_rows:
            return {}
        # A table that has its full-text index is folded too: ``optimize`` then rewrites that index
        # at each fold (alone, +97-191 MB a fold at 262k rows, +167-263 MB at 1M:
        # benchmarks/results-fold-fts.json), but the run's end would otherwise fold every row the
        # run added into one delta at once, and that build grows with them (300k chunks added to
        # 100k: 991.6 MB that way, 603.1 MB a segment at a time; results-scale-grow*.json).
        if retrain and any(f"{c}_idx" == idx.name for idx in table.list_indices() for c in (FTS_COLUMN, DOC_FTS_COLUMN)):
            return {}
        if self.vector_index() is None:
            # The segment's commits left a fragment each. They are merged before the build, while
            # no index covers them: merged after it, LanceDB does that in the first fold, rewriting
            # the indexed rows and remapping the new index over them. Over 65,536 synthetic
            # 384-dimension rows in 16 fragments, that first fold took the process 172 MB over its
            # floor (even for 4,096 new rows, 162 MB), a later fold of as many rows 126 MB; merged
            # first: the merge 137 MB, the build 201 MB, the first fold 16 MB for 4,096 rows and
            # 126 MB for 65,536 (2026-12-06). At a million chunks that first fold was the run's peak.
            # What the merge freed goes back before the build: under a 100k-chunk run's build the
            # floor was 386 MB against 367 MB before the merge, and 368 MB trimmed (peak 579 -> 568).
            # Best effort: a merge that fails (other writers' commits kept conflicting) leaves the
            # first fold to do it, and the build goes on over the segment as it is.
            if _fragment_count(table) > 1:
                try:
                    self._fold(table)
                except StoreError as err:
                    log.warning("%s; the vector index is built over the unmerged rows", err)
                trim_heap()  # glibc only; elsewhere nothing
            return self.ensure_ann(ann, segment=True)
        self._fold(table)
        return {"ann": "folded"}

    def vector_unindexed(self) -> int | None:
        """Rows the vector index lacks, or None when the table has no vector index."""
        index = self.vector_index()
        table = self.open()
        if index is None or table is None:
            return None
        return int(getattr(table.index_stats(index.name), "num_unindexed_rows", 0) or 0)

    def vector_index(self):
        """The ANN index on ``vector`` (its IndexConfig), or None."""
        table = self.open()
        if table is None or "vector" not in table.schema.names:
            return None
        for idx in table.list_indices():
            if list(idx.columns) == ["vector"]:
                return idx
        return None

    def ensure_ann(self, ann, *, rebuild: bool = False, max_deltas: int | None = None, fold_rest: bool = False, segment: bool = False) -> dict:
        """Build the ANN index once the table holds ``ann.min_rows`` rows; retrain it when stale.

        Below the threshold exact search is fast enough and exact. New rows are folded into
        an existing index by ``optimize()`` as a delta index over just them, never by training the
        whole table again (that build's memory grows with the table: +318 MB at a million rows, see
        SEGMENT_ROWS): at
        once when more than a fifth of the rows are not indexed, else by the nightly maintenance.
        The index is trained again as one only on ``rebuild`` or, with ``max_deltas``, once folds
        have left more deltas than ``delta_allowance`` (maintenance and the server's folds ask; a
        plain index run does not, so it never pays for a retrain it did not cause). ``fold_rest``
        (a run that folded segments): any 1,000 rows or more the index lacks are folded in now, since
        a query reads each row not indexed from disk (16,960 of them on a million-row table took a
        vector query from about 24 to 43 ms).

        ``segment`` (the write stage's first fold, :meth:`fold_segment`): an ``IVF_HNSW_SQ`` build
        gets partitions of at least ``HNSW_PARTITION_ROWS`` rows (:func:`segment_partitions`), so
        the first segment's index is one partition. LanceDB merges the first fold into an index of
        several partitions, in memory that grows with the index, and the fold after it spikes: over
        a synthetic 384-dimension table in segments of 65,536 rows, the first build in 2 partitions
        peaked at 605 MB, the first fold (merged, 48 s) at 834 MB and the second at 1,031 MB, against
        555, 708 and 708 MB with one partition (no merge, a delta per fold; the million-row run
        whose first build made 2 partitions peaked at 850-870 MB in its second fold).
        """
        table = self.open()
        if table is None or "vector" not in table.schema.names:
            return {"ann": "none"}
        rows = table.count_rows()
        idx = self.vector_index()
        if rows < ann.min_rows:
            return {"ann": "exact", "rows": rows}
        if idx is not None and not rebuild:
            stats = table.index_stats(idx.name)
            unindexed = int(getattr(stats, "num_unindexed_rows", 0) or 0)
            indexed = int(getattr(stats, "num_indexed_rows", 0) or 0)
            # Each optimize that folds new rows in adds a delta index, and every query searches
            # each delta (at 100k chunks, three folds left four: hybrid CPU 29.6 -> 39.1 ms).
            deltas = int(getattr(stats, "num_indices", 1) or 1)
            if max_deltas is None or deltas <= delta_allowance(indexed, max_deltas):
                if unindexed < 1000 or (unindexed <= indexed // 5 and not fold_rest):
                    return {"ann": "current", "unindexed_rows": unindexed, "ann_deltas": deltas}
                self._fold(table)
                # LanceDB may merge the fold into the last delta rather than add one: counted again.
                after = table.index_stats(idx.name)
                return {"ann": "folded", "unindexed_rows": unindexed, "ann_deltas": int(getattr(after, "num_indices", deltas) or deltas)}
        started = time.perf_counter()

        def build():
            from lancedb.index import IvfFlat, IvfHnswSq, IvfPq

            partitions = (segment_partitions(rows) if segment else hnsw_partitions(rows)) if ann.index_type == "IVF_HNSW_SQ" else None
            if partitions is not None:
                config = IvfHnswSq(distance_type="cosine", num_partitions=partitions, sample_rate=HNSW_SAMPLE_RATE)
            else:
                config = {"IVF_PQ": IvfPq, "IVF_FLAT": IvfFlat}[ann.index_type](distance_type="cosine")
            table.create_index("vector", config=config, replace=True)
            out = {"ann": "built", "ann_index_type": ann.index_type, "ann_build_s": round(time.perf_counter() - started, 2)}
            return out if partitions is None else out | {"ann_partitions": partitions}

        return _with_conflict_retry(table, build, f"building the vector index of {self.table_name}")

    def ann_recall(self, ann, *, queries: int = 50, k: int = 10, seed: int = 0) -> float | None:
        """Recall@k of the ANN index against exact search, with stored vectors as queries."""
        import numpy as np

        table = self.open()
        if table is None or self.vector_index() is None:
            return None
        rows = table.count_rows()
        rng = np.random.default_rng(seed)
        picks = sorted(set(int(i) for i in rng.integers(0, rows, size=queries)))
        vectors = table.take_offsets(picks).select(["vector"]).to_arrow().column("vector").to_pylist()
        total = 0.0
        for vec in vectors:
            # distance_type is on the vector query builder; lancedb's stubs type the base class.
            exact = self._ids(table.search(vec).distance_type("cosine").bypass_vector_index().limit(k))  # pyright: ignore[reportAttributeAccessIssue]
            approx = self._ids(ann_query(table.search(vec).distance_type("cosine"), ann).limit(k))  # pyright: ignore[reportAttributeAccessIssue]
            total += len(set(exact) & set(approx)) / max(len(exact), 1)
        return round(total / max(len(vectors), 1), 4)

    @staticmethod
    def _ids(query) -> list[str]:
        # With the distance it ranks by: a select without it draws LanceDB's autoprojection warning.
        return query.select(["chunk_id", "_distance"]).to_arrow().column("chunk_id").to_pylist()

    def maintain(self, keep_versions_for: timedelta = timedelta(days=7), ann=None) -> dict:
        """Compact fragments, fold new rows into the indices, prune versions older than a week.

        With ``ann`` (the AnnConfig), the vector index is also built or retrained when due,
        and its recall@10 against exact search is measured and reported.
        """
        table = self.open()
        if table is None:
            return {"maintenance": "no table"}
        if self.lacks_document_text():
            self.add_document_text()  # a table written before the document column: upgraded here too
        before = len(table.list_versions())
        _with_conflict_retry(table, lambda: table.optimize(cleanup_older_than=keep_versions_for), f"maintenance of {self.table_name}")
        out: dict = {}
        if ann is not None:
            out = self.ensure_ann(ann, max_deltas=ANN_MAX_DELTAS)
            recall = self.ann_recall(ann)
            if recall is not None:
                out["ann_recall_at_10"] = recall
        unindexed = 0
        for idx in table.list_indices():
            stats = table.index_stats(idx.name)
            unindexed += int(getattr(stats, "num_unindexed_rows", 0) or 0)
        return {
            "maintenance": "optimized",
            "versions_before": before,
            "versions_after": len(table.list_versions()),
            "unindexed_rows_after": unindexed,
            **out,
        }

    def count_rows(self) -> int:
        table = self.open()
        return table.count_rows() if table is not None else 0

    def doc_rows(self, shards: Sequence[str]) -> pa.Table:
        """``doc_id``, ``shard`` and ``file_sha256`` of every row in ``shards``: what the table really
        holds, read without vectors (a column scan: about 70 ms per 100k rows)."""
        table = self.open()
        empty = pa.table({"doc_id": pa.array([], pa.string()), "shard": pa.array([], pa.string()), "file_sha256": pa.array([], pa.string())})
        if table is None or not shards:
            return empty
        try:
            query = table.search().where(f"shard IN ({_sql_list(sorted(set(shards)))})").select(["doc_id", "shard", "file_sha256"])
            return query.limit(None).to_arrow().select(["doc_id", "shard", "file_sha256"])
        except Exception as err:  # a damaged table folder: the caller repairs by re-indexing
            raise StoreError(f"cannot read table {self.table_name} at {self.uri}: {err}") from err

    def docs_present(self, docs: Sequence[str]) -> set[str]:
        """Which of ``docs`` have rows in the table (a filtered scan of one column, 500 ids a query)."""
        table = self.open()
        found: set[str] = set()
        if table is None:
            return found
        for i in range(0, len(docs), 500):
            batch = list(docs[i : i + 500])
            try:
                rows = table.search().where(f"doc_id IN ({_sql_list(batch)})").select(["doc_id"]).limit(None).to_arrow()
            except Exception as err:  # a damaged table folder
                raise StoreError(f"cannot read table {self.table_name} at {self.uri}: {err}") from err
            found.update(rows.column("doc_id").to_pylist())
        return found


# ``ann.refine_factor`` was chosen for recall@10: a query whose limit is larger (the searcher's
# candidate pool, 24 and up) re-ranks as many candidates as ten results would, not refine_factor
# times its limit (480 rows read for a pool of 24 at the default 20: a third of the query's time).
REFINE_RESULTS = 10

# Rows per IVF partition of an HNSW index (at most). LanceDB's default puts a million rows in one
# partition, and the HNSW graph of a partition is built whole in memory: over 1,000,000 clustered
# unit vectors of 384 dimensions the default build peaked at 2,370 MB of RSS in 810 s, 16
# partitions at 944 MB in 344 s, with recall@10 0.96 against exact search when every partition is
# probed (p50 27 ms), 64 partitions 944 MB in 218 s but recall 0.555 with 20 probes (2026-12-04, a
# fresh process per build). ``ann.nprobes`` (20) probes every partition up to 1.3M rows.
HNSW_PARTITION_ROWS = 65_536

# Training rows per IVF partition of an HNSW index, and (times 256) for its scalar quantizer. At
# LanceDB's default, 256, the quantizer trains on 65,536 rows, so a first build over a segment read
# the whole vector column and copied it twice (normalized for cosine, then filtered): over 65,536
# synthetic 384-dimension rows the build grew a fresh process by 200 MB at 256, by 141 MB at 64 or 16
# (46.4 against 35.6 s, recall@10 1.0 either way; a fold, which reuses the quantizer, 131 against
# 110 MB; 2026-12-07). 64: 16,384 rows for the quantizer's bounds, 1,024 for 16 partitions' centroids.
HNSW_SAMPLE_RATE = 64


def delta_allowance(indexed: int, max_deltas: int) -> int:
    """The delta indices an index over ``indexed`` rows may have before it is trained again as one:
    a segment per SEGMENT_ROWS rows (what a run's folds leave: their cost to a query is that of an
    index in as many partitions, which probes them all) plus ``max_deltas`` smaller folds."""
    return max_deltas + max(0, math.ceil(indexed / SEGMENT_ROWS) - 1)


def hnsw_partitions(rows: int) -> int:
    """IVF partitions for an HNSW index over ``rows`` rows: each at most ``HNSW_PARTITION_ROWS``."""
    return max(1, math.ceil(rows / HNSW_PARTITION_ROWS))


def segment_partitions(rows: int) -> int:
    """IVF partitions for a first build over a run's first segment(s): each at least
    ``HNSW_PARTITION_ROWS`` rows, so a segment (a few rows past ``SEGMENT_ROWS``) is one partition
    (see :meth:`VectorStore.ensure_ann`)."""
    return max(1, rows // HNSW_PARTITION_ROWS)


def ann_query(query, ann, limit: int | None = None):
    """Apply the ANN search knobs (probes, exact re-ranking) to a LanceDB vector query of ``limit``
    results: at least ``refine_factor`` x min(limit, 10) candidates are re-ranked exactly."""
    query = query.nprobes(ann.nprobes)
    if ann.refine_factor:
        factor = ann.refine_factor
        if limit and limit > REFINE_RESULTS:
            factor = max(1, math.ceil(ann.refine_factor * REFINE_RESULTS / limit))
        query = query.refine_factor(factor)
    return query


# Columns the searcher and the write stage filter on by value lists: the full-text leg's
# ``doc_id IN (…)`` prefilters (a document's exact score, its chunks), ``chunk_id IN (…)`` (the
# vectors of full-text hits), the writer's deletes by document. A B-tree index answers those
# without scanning every row: on a 100k-chunk table a 60-document prefilter took 12.5 ms of a
# full-text query without it and 7.7 ms with it, a 60-id lookup 7.5 ms and 3.9 ms.
KEY_COLUMNS = ("chunk_id", "doc_id")


def _ensure_key_indices(table: Any, indices: dict) -> None:
    """A B-tree index on each of KEY_COLUMNS the table has, made once (rows written later are folded
    in by ``optimize``, and read by a scan until then, as for the full-text index)."""
    from lancedb.index import BTree

    missing = [c for c in KEY_COLUMNS if c in table.schema.names and f"{c}_idx" not in indices]
    if not missing or table.count_rows() == 0:
        return
    for column in missing:
        table.create_index(column, config=BTree(), replace=True, name=f"{column}_idx")
