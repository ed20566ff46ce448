"""The asset graph: source_files → extracted_content → memory_chunks → chunk_embeddings → memory_vectors → index_coverage.

Each asset handles every partition key of its run (one shard, or a range when the
CLI or the nightly schedule indexes everything in one run) and calls its stage in
``memory_pipeline.stages``. Data flows between the assets as polars DataFrames through
the IO manager (``defs/io_managers.py``): an asset takes its upstream assets as
mappings shard -> frame read on demand and returns :class:`ShardFrames`, its frames
made one shard at a time as the IO manager writes them. Each asset hands the stage's
counts to the ``run_results`` collector (the run summary is built from them) and
reports them as metadata: Dagster's standard ``dagster/row_count`` and
``dagster/column_schema`` beside the project's own counts, and lists of problem files
as table metadata. Every asset carries owners, a ``layer`` tag, kinds and a link to
its code.

Side files are assets of their own, so that lineage shows them: ``file_deletions``
(from source_files), ``extraction_status`` (from extracted_content) and ``indexed_state``
(from memory_vectors), each an extra output of its stage's ``multi_asset``. They are
records the stages keep per file rather than data that flows one way: memory_chunks
amends the extraction status in place (a file whose chunking failed), discovery forgets
an indexed-state record the table contradicts, and the write stage records each shard's
state right after that shard's table commit (what makes a killed run redoable). So the
stages write them through the storage layer (atomically, like every file), their outputs
carry no value (``Nothing``: no IO manager), and the assets that read them declare them
as ``deps``. The one read lineage cannot show is discovery's of ``indexed_state``: it
runs before memory_vectors, and a dependency would be a cycle.
"""

import contextlib
import functools
import importlib
import inspect
import sqlite3
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict
from typing import Any

import dagster as dg
import pyarrow as pa

from memory_pipeline import stages, storage
from memory_pipeline.changes import chunk_budget, fingerprint
from memory_pipeline.defs import checks
from memory_pipeline.defs.io_managers import ShardFrames, column_schema
from memory_pipeline.defs.partitions import MAINTENANCE_TAG, shard_partitions
from memory_pipeline.defs.resources import EmbedderResource, MemoryConfigResource
from memory_pipeline.errors import ConfigError, IndexMismatchError, PrimaryFailed, ProviderError, StoreError
from memory_pipeline.models import CHUNKS_SCHEMA, DELETIONS_SCHEMA, EXTRACTION_STATUS_SCHEMA, INDEXED_STATE_SCHEMA, MANIFEST_SCHEMA, SEGMENTS_SCHEMA
from memory_pipeline.providers.pricing import estimate
from memory_pipeline.stages import RunResults, StageHooks
from memory_pipeline.stages import shards as shards_of_stage
from memory_pipeline.stores.analytics import record_usage
from memory_pipeline.stores.lance import table_schema

GROUP = "memory_index"
OWNERS = ["team:memory"]
_MAX_LISTED = 50
_STEP_RETRIES = 2

PROBLEM_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("path", "string", description="the file (absolute path)"),
        dg.TableColumn("status", "string", description="skipped, failed or partial"),
        dg.TableColumn("reason", "string", description="why it was not (fully) indexed"),
    ]
)

# An input: the IO manager's mapping shard -> polars DataFrame over the run's shards, each read when
# looked up (a Mapping annotation would make Dagster check for a dict).
Frames = storage.LazyFrames


def _table(schema: pa.Schema, row_count: int | None = None, partition_row_count: int | None = None) -> dict:
    """The column schema and the row counts, under Dagster's standard keys."""
    meta: dict[str, dg.MetadataValue] = {"dagster/column_schema": dg.MetadataValue.table_schema(column_schema(schema))}
    if row_count is not None:
        meta["dagster/row_count"] = dg.MetadataValue.int(row_count)
    if partition_row_count is not None:
        meta["dagster/partition_row_count"] = dg.MetadataValue.int(partition_row_count)
    return meta


def _problems(rows: list[dict], status: str = "failed") -> dg.TableMetadataValue:
    """Problem files as table metadata (path, status, reason), at most _MAX_LISTED and a line for the rest."""
    records = [
        dg.TableRecord({"path": str(r["path"]), "status": str(r.get("status") or status), "reason": str(r.get("reason") or "")}) for r in rows[:_MAX_LISTED]
    ]
    if len(rows) > _MAX_LISTED:
        records.append(dg.TableRecord({"path": "…", "status": "", "reason": f"{len(rows) - _MAX_LISTED} more"}))
    return dg.MetadataValue.table(records, schema=PROBLEM_SCHEMA)


def _side_file(context: dg.AssetExecutionContext, settings, name: str, shards: list[str]) -> dg.Output:
    """The (value-less) output of a side-file asset: its schema, rows and where its files are; each
    partition's own row count on its materialization."""
    data = storage.of(settings)
    asset, suffix = storage.locate(name)
    every = shard_partitions.get_partition_keys()
    own = {shard: {"dagster/partition_row_count": data.row_count(asset, [shard], suffix)} for shard in shards}
    _partition_numbers(context, name, own)
    in_run = sum(n["dagster/partition_row_count"] for n in own.values())
    total = in_run if len(shards) == len(every) else data.row_count(asset, every, suffix)
    meta = _table(_SIDE_SCHEMAS[name], row_count=total, partition_row_count=in_run)
    meta["dagster/uri"] = dg.MetadataValue.path(data.asset_location(asset))
    meta["files"] = dg.MetadataValue.text(f"<shard>{suffix}.parquet")
    return dg.Output(None, output_name=name, metadata=meta)


_SIDE_SCHEMAS = {"file_deletions": DELETIONS_SCHEMA, "extraction_status": EXTRACTION_STATUS_SCHEMA, "indexed_state": INDEXED_STATE_SCHEMA}


def _parquet_out(schema: pa.Schema, layer: str, description: str, **kwargs) -> dg.AssetOut:
    """A Parquet asset of a stage's multi_asset: group, owners, layer tag, kinds and column schema."""
    return dg.AssetOut(
        group_name=GROUP,
        owners=OWNERS,
        tags={"layer": layer},
        kinds={"python", "parquet"},
        metadata=_table(schema),
        description=description,
        **kwargs,
    )


def _side_out(name: str, layer: str, description: str) -> dg.AssetOut:
    """A side file's asset: no value passes (see the module docstring)."""
    return _parquet_out(_SIDE_SCHEMAS[name], layer, description, key=dg.AssetKey(name), dagster_type=dg.Nothing)


@contextlib.contextmanager
def _reported(results: RunResults, retry_transient: bool) -> Iterator[None]:
    """An asset's error goes to the run's collector (the CLI reports it as itself); with
    ``retry_transient``, transient storage errors retry the step (a mismatch, a bad config or
    an object store that denies access or lacks the bucket fails at once)."""
    try:
        yield
    except (IndexMismatchError, ConfigError) as err:
        results.failed(err)
        raise
    except (StoreError, sqlite3.OperationalError) as err:
        results.failed(err)
        if not retry_transient or storage.permanent_failure(err):
            raise
        raise dg.RetryRequested(max_retries=_STEP_RETRIES, seconds_to_wait=2) from err
    except Exception as err:
        results.failed(err)
        raise


def _stage(retry_transient: bool = False):
    """Wrap an asset body (a function, or a generator of its outputs) in :func:`_reported`;
    a step that went through clears an earlier attempt's error."""

    def decorate(fn):
        signature = inspect.signature(fn)

        def results_of(args, kwargs) -> RunResults:
            return signature.bind(*args, **kwargs).arguments["run_results"]

        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def generator(*args, **kwargs):
                results = results_of(args, kwargs)
                with _reported(results, retry_transient):
                    yield from fn(*args, **kwargs)
                results.error = None  # a retried step that went through: its earlier error is not the run's

            return generator

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            results = results_of(args, kwargs)
            with _reported(results, retry_transient):
                out = fn(*args, **kwargs)
            results.error = None
            return out

        return wrapper

    return decorate


def _frames(
    stream: Iterable[tuple[str, Any]],
    results: RunResults,
    metadata: Callable[[], Mapping[str, Any]],
    retry_transient: bool = False,
    *,
    context: dg.AssetExecutionContext,
    key: str,
    counts: Any = None,
    per_shard: dict[str, dict[str, int]] | None = None,
) -> ShardFrames:
    """A stage's frames as the asset's output. The stage runs as the IO manager consumes them, so its
    errors are reported there the way the body's are.

    Each partition's materialization carries that shard's own numbers: its rows
    (``dagster/partition_row_count``) and what the shard added to the stage's ``counts``
    (measured between the frames), or the numbers the stage recorded in ``per_shard``; in a run
    over several shards, also the files that failed in that shard (the run's list is then
    ``run_failures``). The output's own metadata keeps the run's totals for the keys no partition
    overrides.
    """
    numbers: dict[str, dict[str, int]] = per_shard if per_shard is not None else {}
    lists: dict[str, dict[str, list]] = {}
    pairs = shards_of_stage.measured(stream, counts, numbers, lists) if counts is not None else stream

    def own(shard: str, rows: int) -> None:
        problems = {k: _problems(v) for k, v in lists.get(shard, {}).items()}
        context.add_asset_metadata({**numbers.get(shard, {}), **problems, "dagster/partition_row_count": rows}, asset_key=key, partition_key=shard)

    def run_metadata() -> Mapping[str, Any]:
        # A list each partition has its own of (its failures) is the run's under run_<name>.
        md = dict(metadata())
        run_level(context, md, keep=set(md) - set(shards_of_stage.listed(counts)))
        return md

    def guarded():
        with _reported(results, retry_transient):
            # A shard may come in pieces (consecutive pairs): its numbers once its last piece is made.
            current, rows = None, 0
            for shard, frame in pairs:
                if shard != current:
                    if current is not None:
                        own(current, rows)
                    current, rows = shard, 0
                rows += frame.height
                yield shard, frame
                del frame  # not held while the stage makes the next
            if current is not None:
                own(current, rows)

    return ShardFrames(guarded(), run_metadata)


def run_level(context: dg.AssetExecutionContext, metadata: dict, *, keep: set[str]) -> None:
    """In a run over several partitions, name the run's numbers as the run's (``run_<key>``): the
    output's metadata goes on every partition's materialization, where a run's tokens, cost,
    seconds, requests or batch jobs would read as each partition's (the cost counted once per
    partition). Each partition gets its own numbers under the plain names (``add_asset_metadata``
    per partition); the ``keep`` keys (what the run embedded with) stay as they are. In a
    one-partition run the run is the partition: nothing is renamed."""
    if len(context.partition_keys) <= 1:
        return
    for key in [k for k in metadata if k not in keep and not k.startswith("dagster/")]:
        metadata[f"run_{key}"] = metadata.pop(key)


def _partition_numbers(context: dg.AssetExecutionContext, key: str, per_shard: Mapping[str, Mapping[str, int]]) -> None:
    """Each shard's own numbers on its partition's materialization of ``key``."""
    for shard, numbers in per_shard.items():
        context.add_asset_metadata(dict(numbers), asset_key=key, partition_key=shard)


def _ensure_consumed(frames: ShardFrames, name: str) -> None:
    # Another IO manager (one that stores the object as it is) would skip the stage's work.
    if not frames.consumed:
        raise dg.DagsterInvariantViolationError(f"{name}: the io_manager did not consume its frames (PolarsParquetIOManager does)")


class IndexRunConfig(dg.Config):
    """Per-run knobs."""

    force: bool = False  # re-index every file (vectors still come from the cache)


@dg.multi_asset(
    outs={
        "source_files": _parquet_out(MANIFEST_SCHEMA, "ingest", "One row per file under the configured sources: stat, sha256, sniffed type, status, action."),
        "file_deletions": _side_out("file_deletions", "ingest", "Files deleted since the last run, whose rows the next write removes."),
    },
    partitions_def=shard_partitions,
)
@_stage()
def source_files(
    context: dg.AssetExecutionContext,
    config: IndexRunConfig,
    memory_config: MemoryConfigResource,
    embedder: EmbedderResource,
    run_results: dg.ResourceParam[RunResults],
):
    settings = memory_config.settings()
    ident = embedder.identity(settings)
    shards = list(context.partition_keys)
    counts = run_results.discover = stages.DiscoverCounts()
    bad: list[dict] = []

    def metadata() -> dict:
        own = {shard: stages.run_errors(settings, [shard]) for shard in shards}
        bad.extend(sorted((e for errs in own.values() for e in errs), key=lambda e: e["path"]))
        numbers = {k: dg.MetadataValue.int(v) for k, v in asdict(counts).items()}  # each partition's own, from _frames
        for shard, errs in own.items():  # each partition lists its own problem files
            context.add_asset_metadata({"problems": _problems(errs)}, asset_key="source_files", partition_key=shard)
        md = {**numbers, "partitions": len(shards), "problems": _problems(bad)}
        run_level(context, md, keep=set(numbers))  # over several shards, the count and list are the run's
        return md

    stream = stages.discover(settings, shards, force=config.force, fp=fingerprint(settings, ident), ident=ident, counts=counts)
    frames = _frames(stream, run_results, metadata, context=context, key="source_files", counts=counts)
    yield dg.Output(frames, output_name="source_files")
    _ensure_consumed(frames, "source_files")
    for err in bad:
        context.log.warning(f"{err['status']}: {err['path']}: {err['reason']}")
    yield _side_file(context, settings, "file_deletions", shards)


@dg.multi_asset(
    outs={
        "extracted_content": _parquet_out(
            SEGMENTS_SCHEMA, "ingest", "Text segments with line locators for every new or changed file; unreadable files get a reason."
        ),
        "extraction_status": _side_out(
            "extraction_status", "ingest", "Per-file extraction outcome: ok, failed (with reason) or partial; memory_chunks adds its own failures."
        ),
    },
    partitions_def=shard_partitions,
)
@_stage()
def extracted_content(context: dg.AssetExecutionContext, source_files: Frames, memory_config: MemoryConfigResource, run_results: dg.ResourceParam[RunResults]):
    settings = memory_config.settings()
    shards = list(context.partition_keys)
    counts = run_results.extract = stages.ExtractCounts()

    def metadata() -> dict:
        return {
            "files": counts.files,
            "extracted": counts.extracted,
            "failed": counts.failed,
            "segments": counts.segments,
            "chars": counts.chars,
            "failures": _problems(counts.failures),
        }

    # The model is loaded only when chunk_embeddings has work: loading it in a thread here was
    # measured slower (its import contends for the GIL with extraction and chunking).
    frames = _frames(stages.extract_content(settings, source_files, counts), run_results, metadata, context=context, key="extracted_content", counts=counts)
    yield dg.Output(frames, output_name="extracted_content")
    _ensure_consumed(frames, "extracted_content")
    for f in counts.failures:
        context.log.warning(f"extraction failed: {f['path']}: {f['reason']}")
    yield _side_file(context, settings, "extraction_status", shards)


@dg.asset(
    partitions_def=shard_partitions,
    deps=[dg.AssetKey("extraction_status")],
    group_name=GROUP,
    owners=OWNERS,
    tags={"layer": "ingest"},
    kinds={"python", "parquet"},
    metadata=_table(CHUNKS_SCHEMA),
    description="Token-aware chunks with stable ids, never over the embedding model's input limit.",
)
@_stage()
def memory_chunks(
    context: dg.AssetExecutionContext,
    source_files: Frames,
    extracted_content: Frames,
    memory_config: MemoryConfigResource,
    embedder: EmbedderResource,
    run_results: dg.ResourceParam[RunResults],
):
    settings = memory_config.settings()
    resolved = embedder.resolved(settings)
    ident = embedder.identity(settings)
    counts = run_results.chunk = stages.ChunkCounts()
    budget, overlap = chunk_budget(settings, ident)

    def metadata() -> dict:
        return {
            "files": counts.files,
            "chunks": counts.chunks,
            "tokens": counts.tokens,
            "chunk_tokens": budget,
            "overlap_tokens": overlap,
            "max_model_tokens": counts.max_model_tokens,
            "failed": counts.failed,
            "model_input_limit": ident.max_input_tokens or 0,
            "failures": _problems(counts.failures),
        }

    chunks = stages.make_chunks(settings, source_files, extracted_content, resolved.provider, ident, counts)
    frames = _frames(chunks, run_results, metadata, context=context, key="memory_chunks", counts=counts)
    yield dg.Output(frames)
    _ensure_consumed(frames, "memory_chunks")
    for f in counts.failures:
        context.log.warning(f"chunking failed: {f['path']}: {f['reason']}")


@dg.asset(
    partitions_def=shard_partitions,
    group_name=GROUP,
    owners=OWNERS,
    tags={"layer": "index"},
    kinds={"python", "parquet"},
    description="Vectors for the chunks of changed files: the embedding cache first, the provider for the rest.",
)
@_stage(retry_transient=True)
def chunk_embeddings(
    context: dg.AssetExecutionContext,
    memory_chunks: Frames,
    memory_config: MemoryConfigResource,
    embedder: EmbedderResource,
    stage_hooks: dg.ResourceParam[StageHooks],
    run_results: dg.ResourceParam[RunResults],
):
    # lancedb takes seconds to import; do it while the model computes (torch releases the GIL).
    threading.Thread(target=importlib.import_module, args=("lancedb",), name="import-lancedb", daemon=True).start()
    settings = memory_config.settings()
    resolved = embedder.resolved(settings)
    ident = embedder.identity(settings)
    counts = stages.EmbedCounts()
    run_results.embed = counts  # filled in wave by wave: a run that fails part-way reports what was done
    per_shard: dict[str, dict[str, int]] = {}

    def primary_failed(err: ProviderError) -> Exception:
        if not settings.fallback or resolved.fallback_from is not None:
            return err
        # The primary failed for good (retries spent or refused): later runs use the fallback.
        from memory_pipeline.providers.registry import mark_primary_failed

        mark_primary_failed(settings, ident.provider, str(err))
        context.log.error(f"{ident.provider} failed permanently; the fallback {settings.fallback} is used from the next run")
        return PrimaryFailed(f"{err}; the fallback {settings.fallback} takes over from the next run", provider=ident.provider, status=err.status)

    def usage() -> None:
        """What was sent to the provider, into the usage ledger: after the last wave, or after the
        wave that failed (its tokens were spent all the same). Accounting: it never hides the
        run's own error."""
        batch_tokens = int((counts.batch or {}).get("batch_tokens", 0))
        try:
            record_usage(
                settings,
                run_id=context.run_id,
                provider=ident.provider,
                model=ident.model,
                chunks=counts.embedded - counts.batched,
                tokens=counts.tokens_embedded,
            )
            record_usage(settings, run_id=context.run_id, provider=ident.provider, model=ident.model, chunks=counts.batched, tokens=batch_tokens, batch=True)
        except OSError as err:
            context.log.warning(f"the embedding usage of this step could not be recorded: {err}")

    try:
        # The first wave of vectors is made here; the others as the frames are written (stages.embed_chunks).
        waves = stages.embed_chunks(settings, memory_chunks, resolved.provider, ident, hooks=stage_hooks, counts=counts, per_shard=per_shard)
    except ProviderError as err:
        usage()  # what the first wave embedded before the failure was spent all the same
        failure = primary_failed(err)
        if failure is err:
            raise
        raise failure from err
    metadata: dict = {}

    def finished() -> None:
        """After the last wave: the model's memory let go, the step's numbers."""
        batch_tokens = int((counts.batch or {}).get("batch_tokens", 0))
        cost = estimate(ident.provider, ident.model, batch_tokens=batch_tokens, live_tokens=counts.tokens_embedded)
        if counts.embedded:
            embedder.release()  # the table writes and the coverage that follow run without the model's memory
        if resolved.provider is None:
            context.log.warning(f"full-text only: {resolved.reason}")
        info = run_results.embed_info = stages.EmbedInfo(
            provider=ident.provider,
            model=ident.model,
            dims=ident.dims,
            mode="vector+fts" if resolved.provider is not None else "fts-only",
            requested_provider=resolved.requested,
            # Why a fallback stands in, or why nothing embeds (full-text only).
            fallback_reason=resolved.reason if resolved.fallback_from or (resolved.provider is None and resolved.requested != "none") else "",
            est_cost_usd=cost["estimated_cost_usd"],
            tokens_total=counts.tokens_embedded + batch_tokens,
        )
        # Without a provider the stage makes empty one-dimensional frames (see stages.embed_chunks).
        metadata.update(
            {
                "provider": ident.provider,
                "model": ident.model,
                "dims": ident.dims,
                "chunks": counts.chunks,
                "unique": counts.unique,
                "cached": counts.cached,
                "embedded": counts.embedded,
                "media_embedded": counts.media_embedded,
                "tokens": counts.tokens_embedded,
                "tokens_total": counts.tokens_embedded + batch_tokens,
                "est_cost_usd": cost["estimated_cost_usd"],
                "embed_seconds": round(counts.seconds, 3),
                "mode": info.mode,
                "requested_provider": resolved.requested,
                "fallback_reason": info.fallback_reason,
                "requests": int(getattr(resolved.provider, "stats", {}).get("requests", 0)),
                "retries": int(getattr(resolved.provider, "stats", {}).get("retries", 0)),
                **_batch_metadata(counts),
            }
        )
        # Each partition's share of the estimated cost, by its tokens (a shard's own numbers, as its
        # chunks and tokens are: ``stages.embed_chunks``'s ``per_shard``).
        # By tokens; by what each embedded where none were counted (media embedded natively).
        weight = "tokens_total" if any(n.get("tokens_total") for n in per_shard.values()) else "embedded"
        run_cost, spent = cost["estimated_cost_usd"], sum(n.get(weight, 0) for n in per_shard.values())
        for shard, numbers in per_shard.items():
            share = None if run_cost is None else (run_cost * numbers.get(weight, 0) / spent if spent else 0.0)
            context.add_asset_metadata({"est_cost_usd": share}, asset_key="chunk_embeddings", partition_key=shard)
        run_level(context, metadata, keep={"provider", "model", "dims", "mode", "requested_provider", "fallback_reason"})

    def stream() -> Iterator[tuple[str, Any]]:
        try:
            yield from waves
        except ProviderError as err:
            failure = primary_failed(err)
            if failure is err:
                raise
            raise failure from err
        finally:
            usage()
        finished()

    frames = _frames(stream(), run_results, lambda: metadata, retry_transient=True, context=context, key="chunk_embeddings", per_shard=per_shard)
    yield dg.Output(frames)
    _ensure_consumed(frames, "chunk_embeddings")


def _batch_metadata(counts: stages.EmbedCounts) -> dict:
    """The run's batch-API metrics: flat numbers to chart, plus the whole record as JSON."""
    b = counts.batch
    if b is None:
        return {"batch": dg.MetadataValue.json({"enabled": False})}
    flat = {
        "batch_jobs_submitted": b["jobs_submitted"],
        "batch_jobs_resumed": b["jobs_resumed"],
        "batch_jobs_pending": b["jobs_pending"],
        "batch_requests": b["requests_submitted"],
        "batch_tokens": b["batch_tokens"],
        "batched": counts.batched,
        "pending": counts.pending,
        "live_fallbacks": b["live_fallbacks"],
        "cache_hits": b["cache_hits"],
    }
    costs = {k: dg.MetadataValue.float(float(b[k])) for k in ("estimated_cost_usd", "live_cost_usd") if b[k] is not None}
    return {**flat, **costs, "batch": dg.MetadataValue.json(b)}


@dg.multi_asset(
    outs={
        "memory_vectors": dg.AssetOut(
            dagster_type=dg.Nothing,  # the LanceDB table, written by the stage: no value passes
            group_name=GROUP,
            owners=OWNERS,
            tags={"layer": "index"},
            kinds={"lancedb"},
            description="The LanceDB table agents search; each changed file's rows replaced in one commit.",
        ),
        "indexed_state": _side_out(
            "indexed_state", "index", "What the table holds per file (content hash, fingerprint, chunk count), recorded after each commit."
        ),
    },
    deps=[dg.AssetKey("file_deletions"), dg.AssetKey("extraction_status")],
    partitions_def=shard_partitions,
)
@_stage(retry_transient=True)
def memory_vectors(
    context: dg.AssetExecutionContext,
    config: IndexRunConfig,
    source_files: Frames,
    memory_chunks: Frames,
    chunk_embeddings: Frames,
    memory_config: MemoryConfigResource,
    embedder: EmbedderResource,
    stage_hooks: dg.ResourceParam[StageHooks],
    run_results: dg.ResourceParam[RunResults],
):
    settings = memory_config.settings()
    ident = embedder.identity(settings)
    shards = list(context.partition_keys)
    per_shard: dict[str, dict[str, int]] = {}
    write = functools.partial(
        stages.write_vectors, settings, ident, manifests=source_files, chunks=memory_chunks, embeddings=chunk_embeddings, per_shard=per_shard
    )
    try:
        stats = write(force=config.force, hooks=stage_hooks)
    except IndexMismatchError:
        if not config.force:
            raise
        context.log.warning("model or dimension changed: rebuilding the table (forced)")
        stages.reset_index_state(settings)
        stats = write(recreate=True, force=True, hooks=stage_hooks)
    run_results.write = stats
    _partition_numbers(context, "memory_vectors", per_shard)
    maintenance = {}
    if context.run.tags.get(MAINTENANCE_TAG) == "true":
        from memory_pipeline.stores import generations
        from memory_pipeline.stores.lance import VectorStore

        maintenance = VectorStore(storage.of(settings).lancedb_uri, generations.current(settings)[0]).maintain(ann=settings.ann)
        context.log.info(f"table maintenance: {maintenance}")
    yield dg.Output(
        None,
        output_name="memory_vectors",
        metadata={
            **{k: v for k, v in asdict(stats).items()},
            **maintenance,
            **_table(table_schema(ident.dims, ident.meta()), row_count=stats.table_rows),
            "uri": storage.of(settings).lancedb_uri,
        },
    )
    yield _side_file(context, settings, "indexed_state", shards)


@dg.asset(
    deps=[dg.AssetKey("memory_vectors")],
    group_name=GROUP,
    owners=OWNERS,
    tags={"layer": "analytics"},
    kinds={"duckdb"},
    description="Coverage of the index with DuckDB: manifest, errors and table side by side (data_dir/analytics.duckdb).",
    # What the sensor and the schedule do not say: coverage follows the table whatever updated
    # it. A backfill of a few shards from the UI (or any run that leaves coverage out) changes
    # memory_vectors; the coverage automation sensor then refreshes the analysts' numbers once,
    # after the run, and never while a shard is still being written.
    automation_condition=dg.AutomationCondition.eager(),
)
@_stage()
def index_coverage(
    context: dg.AssetExecutionContext,
    memory_config: MemoryConfigResource,
    embedder: EmbedderResource,
    run_results: dg.ResourceParam[RunResults],
) -> dg.MaterializeResult:
    from memory_pipeline.stores.analytics import query

    settings = memory_config.settings()
    report = memory_config.coverage(settings, embedder.identity(settings))
    run_results.coverage = round(report.coverage_ratio, 4)
    table = ["| source | modality | files | indexed | skipped | failed | stale | rows | coverage |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report.coverage:
        table.append(
            f"| {r['source']} | {r['modality']} | {r['files_discovered']} | {r['files_indexed']} | {r['files_skipped']} "
            f"| {r['files_failed']} | {r['files_stale']} | {r['rows']} | {r['coverage']:.1%} |"
        )
    if report.cost:
        table += ["", "| provider | model | rows | tokens in table | est. USD (table) |", "|---|---|---|---|---|"]
        for c in report.cost:
            usd = "unknown" if c["est_usd_table"] is None else f"{c['est_usd_table']:.4f}"
            table.append(f"| {c['provider']} | {c['model']} | {c['rows']} | {c['tokens_in_table']} | {usd} |")
    return dg.MaterializeResult(
        metadata={
            "coverage": round(report.coverage_ratio, 4),
            "files_indexable": report.files_indexable,
            "files_indexed": report.files_indexed,
            "rows": report.table_rows,
            "tokens_in_table": sum(c["tokens_in_table"] for c in report.cost),
            "est_usd_table": round(sum(c["est_usd_table"] or 0.0 for c in report.cost), 6),
            **{f"problems_{k}": len(v) for k, v in sorted(report.problems.items())},
            # The asset's rows are the coverage table's: one per source and modality.
            **_table(query(settings, "SELECT * FROM coverage LIMIT 0").schema, row_count=len(report.coverage)),
            "summary": dg.MetadataValue.md("\n".join(table)),
            "database": str(report.path),
        }
    )


# Each asset links to its code in the UI (dagster/code_references). The names are rebound so that
# the defs folder loader and index_assets both see the annotated definitions. Code references are
# a beta API: its warning would reach the stderr of every `memory` command that imports this module.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)
    # Typed as the union of every asset kind it accepts; given AssetsDefinitions it returns AssetsDefinitions.
    source_files, extracted_content, memory_chunks, chunk_embeddings, memory_vectors, index_coverage = dg.with_source_code_references(  # pyright: ignore[reportAssignmentType]
        [source_files, extracted_content, memory_chunks, chunk_embeddings, memory_vectors, index_coverage]
    )

# What one run materializes: the graph and the checks of its coverage.
index_assets = [source_files, extracted_content, memory_chunks, chunk_embeddings, memory_vectors, index_coverage, checks.index_coverage_checks]
