"""The asset graph: source_files → extracted_content → memory_chunks → chunk_embeddings → memory_vectors.

Each asset handles every partition key of its run (one shard, or a range when the
CLI or the nightly schedule indexes everything in one run), delegates to the
plain functions in ``memory_pipeline.pipeline`` and reports counts as metadata.
"""


import functools
import importlib
import sqlite3
import threading
from dataclasses import asdict

import dagster as dg

from memory_pipeline import pipeline
from memory_pipeline.defs.partitions import MAINTENANCE_TAG, shard_partitions
from memory_pipeline.defs.resources import MemoryConfigResource
from memory_pipeline.errors import ConfigError, IndexMismatchError, PrimaryFailed, ProviderError, StoreError
from memory_pipeline.providers.pricing import estimate
from memory_pipeline.stores.analytics import record_usage

GROUP = "memory_index"
_MAX_LISTED = 50
_STEP_RETRIES = 2


def _retry_transient(fn):
    """Retry the step on transient storage errors only (a mismatch or a bad config fails at once)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (IndexMismatchError, ConfigError):
            raise
        except (StoreError, sqlite3.OperationalError) as err:
            raise dg.RetryRequested(max_retries=_STEP_RETRIES, seconds_to_wait=2) from err

    return wrapper


class IndexRunConfig(dg.Config):
    """Per-run knobs."""

    force: bool = False  # re-index every file (vectors still come from the cache)


def _errors_md(rows: list[dict]) -> str:
    if not rows:
        return "no errors"
    lines = ["| path | reason |", "|---|---|"]
    lines += [f"| `{r['path']}` | {r['reason']} |" for r in rows[:_MAX_LISTED]]
    if len(rows) > _MAX_LISTED:
        lines.append(f"| … | {len(rows) - _MAX_LISTED} more |")
    return "\n".join(lines)


@dg.asset(
    partitions_def=shard_partitions,
    group_name=GROUP,
    kinds={"python", "parquet"},
    description="One row per file under the configured sources: stat, sha256, sniffed type, status, action.",
)
def source_files(context: dg.AssetExecutionContext, config: IndexRunConfig, memory_config: MemoryConfigResource) -> dg.MaterializeResult:
    settings = memory_config.settings()
    resolved = memory_config.provider(settings)
    ident = pipeline.EmbeddingIdentity.of(resolved)
    shards = list(context.partition_keys)
    counts = pipeline.discover(settings, shards, force=config.force, fp=pipeline.fingerprint(settings, ident), ident=ident)
    bad = pipeline.run_errors(settings, shards)
    for err in bad:
        context.log.warning(f"{err['status']}: {err['path']}: {err['reason']}")
    return dg.MaterializeResult(
        metadata={
            **{k: dg.MetadataValue.int(v) for k, v in asdict(counts).items()},
            "partitions": len(shards),
            "problems": dg.MetadataValue.md(_errors_md(bad)),
        }
    )


@dg.asset(
    partitions_def=shard_partitions,
    deps=[source_files],
    group_name=GROUP,
    kinds={"python", "parquet"},
    description="Text segments with line locators for every new or changed file; unreadable files get a reason.",
)
def extracted_content(context: dg.AssetExecutionContext, memory_config: MemoryConfigResource) -> dg.MaterializeResult:
    settings = memory_config.settings()
    shards = list(context.partition_keys)
    # The model is loaded only when chunk_embeddings has work: loading it in a thread here was
    # measured slower (its import contends for the GIL with extraction and chunking).
    counts = pipeline.extract_content(settings, shards)
    for f in counts.failures:
        context.log.warning(f"extraction failed: {f['path']}: {f['reason']}")
    return dg.MaterializeResult(
        metadata={
            "files": counts.files,
            "extracted": counts.extracted,
            "failed": counts.failed,
            "segments": counts.segments,
            "chars": counts.chars,
            "failures": dg.MetadataValue.md(_errors_md(counts.failures)),
        }
    )


@dg.asset(
    partitions_def=shard_partitions,
    deps=[extracted_content],
    group_name=GROUP,
    kinds={"python", "parquet"},
    description="Token-aware chunks with stable ids, never over the embedding model's input limit.",
)
def memory_chunks(context: dg.AssetExecutionContext, memory_config: MemoryConfigResource) -> dg.MaterializeResult:
    settings = memory_config.settings()
    resolved = memory_config.provider(settings)
    ident = pipeline.EmbeddingIdentity.of(resolved)
    counts = pipeline.make_chunks(settings, list(context.partition_keys), resolved.provider, ident)
    for f in counts.failures:
        context.log.warning(f"chunking failed: {f['path']}: {f['reason']}")
    budget, overlap = pipeline.chunk_budget(settings, ident)
    return dg.MaterializeResult(
        metadata={
            "files": counts.files,
            "chunks": counts.chunks,
            "tokens": counts.tokens,
            "chunk_tokens": budget,
            "overlap_tokens": overlap,
            "max_model_tokens": counts.max_model_tokens,
            "failed": counts.failed,
            "model_input_limit": ident.max_input_tokens or 0,
        }
    )


@dg.asset(
    partitions_def=shard_partitions,
    deps=[memory_chunks],
    group_name=GROUP,
    kinds={"python", "parquet"},
    description="Vectors for the chunks of changed files: the embedding cache first, the provider for the rest.",
)
@_retry_transient
def chunk_embeddings(context: dg.AssetExecutionContext, memory_config: MemoryConfigResource) -> dg.MaterializeResult:
    # lancedb takes seconds to import; do it while the model computes (torch releases the GIL).
    threading.Thread(target=importlib.import_module, args=("lancedb",), name="import-lancedb", daemon=True).start()
    settings = memory_config.settings()
    resolved = memory_config.provider(settings)
    ident = pipeline.EmbeddingIdentity.of(resolved)
    try:
        counts = pipeline.embed_chunks(settings, list(context.partition_keys), resolved.provider, ident)
    except ProviderError as err:
        if not settings.fallback or resolved.fallback_from is not None:
            raise
        # The primary failed for good (retries spent or refused): later runs use the fallback.
        from memory_pipeline.providers.registry import mark_primary_failed

        mark_primary_failed(settings, ident.provider, str(err))
        context.log.error(f"{ident.provider} failed permanently; the fallback {settings.fallback} is used from the next run")
        raise PrimaryFailed(
            f"{err}; the fallback {settings.fallback} takes over from the next run", provider=ident.provider, status=err.status
        ) from err
    batch_tokens = int((counts.batch or {}).get("batch_tokens", 0))
    cost = estimate(ident.provider, ident.model, batch_tokens=batch_tokens, live_tokens=counts.tokens_embedded)
    record_usage(settings, run_id=context.run_id, provider=ident.provider, model=ident.model, chunks=counts.embedded - counts.batched, tokens=counts.tokens_embedded)
    record_usage(settings, run_id=context.run_id, provider=ident.provider, model=ident.model, chunks=counts.batched, tokens=batch_tokens, batch=True)
    if counts.embedded and hasattr(resolved.provider, "release"):
        resolved.provider.release()
    if resolved.provider is None:
        context.log.warning(f"full-text only: {resolved.reason}")
    return dg.MaterializeResult(
        metadata={
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
            "mode": "vector+fts" if resolved.provider is not None else "fts-only",
            "requested_provider": resolved.requested,
            "fallback_reason": resolved.reason if resolved.fallback_from else "",
            "requests": int(getattr(resolved.provider, "stats", {}).get("requests", 0)),
            "retries": int(getattr(resolved.provider, "stats", {}).get("retries", 0)),
            **_batch_metadata(counts),
        }
    )


def _batch_metadata(counts: pipeline.EmbedCounts) -> dict:
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


@dg.asset(
    partitions_def=shard_partitions,
    deps=[chunk_embeddings],
    group_name=GROUP,
    kinds={"lancedb"},
    description="The LanceDB table agents search; each changed file's rows replaced in one commit.",
)
@_retry_transient
def memory_vectors(context: dg.AssetExecutionContext, config: IndexRunConfig, memory_config: MemoryConfigResource) -> dg.MaterializeResult:
    settings = memory_config.settings()
    resolved = memory_config.provider(settings)
    ident = pipeline.EmbeddingIdentity.of(resolved)
    shards = list(context.partition_keys)
    try:
        stats = pipeline.write_vectors(settings, shards, ident, force=config.force)
    except IndexMismatchError:
        if not config.force:
            raise
        context.log.warning("model or dimension changed: rebuilding the table (forced)")
        pipeline.reset_index_state(settings)
        stats = pipeline.write_vectors(settings, shards, ident, recreate=True, force=True)
    maintenance = {}
    if context.run.tags.get(MAINTENANCE_TAG) == "true":
        from memory_pipeline.stores.lance import VectorStore

        from memory_pipeline.stores import generations

        maintenance = VectorStore(settings.lancedb_uri, generations.current(settings)[0]).maintain(ann=settings.ann)
        context.log.info(f"table maintenance: {maintenance}")
    return dg.MaterializeResult(
        metadata={
            **{k: v for k, v in asdict(stats).items()},
            **maintenance,
            "uri": settings.lancedb_uri,
        }
    )


_CHECKS = {
    "index_coverage_no_orphans_check": (True, "no table rows of files that are gone"),
    "index_coverage_no_duplicates_check": (True, "every chunk id is stored once"),
    "index_coverage_single_model_check": (True, "one model and dimension in the table, the configured one"),
    "index_coverage_threshold_check": (False, "indexed files / indexable files >= checks.min_coverage"),
    "index_coverage_fts_current_check": (False, "the full-text index exists and covers the table"),
}


@dg.asset(
    deps=[memory_vectors],
    group_name=GROUP,
    kinds={"duckdb"},
    description="Coverage of the index with DuckDB: manifest, errors and table side by side (data_dir/analytics.duckdb).",
    check_specs=[
        dg.AssetCheckSpec(name, asset="index_coverage", blocking=blocking, description=desc)
        for name, (blocking, desc) in _CHECKS.items()
    ],
)
def index_coverage(context: dg.AssetExecutionContext, memory_config: MemoryConfigResource) -> dg.MaterializeResult:
    from memory_pipeline.stores.analytics import refresh_analytics

    settings = memory_config.settings()
    ident = pipeline.EmbeddingIdentity.of(memory_config.provider(settings))
    from memory_pipeline.stores import generations

    report = refresh_analytics(settings, ident.model, generations.table_for(settings, ident.meta()))

    def result(name: str, passed: bool, kind: str | None = None, **extra) -> dg.AssetCheckResult:
        paths = report.paths(kind) if kind else []
        meta = {"offending_paths": dg.MetadataValue.json(paths[:200]), "count": len(paths), **extra}
        return dg.AssetCheckResult(check_name=name, passed=passed, metadata=meta)

    wrong_dims = report.table_rows > 0 and report.table_dims != ident.dims
    checks = [
        result("index_coverage_no_orphans_check", not report.problems.get("orphan_rows"), "orphan_rows"),
        result("index_coverage_no_duplicates_check", not report.problems.get("duplicate_chunk_id"), "duplicate_chunk_id"),
        result(
            "index_coverage_single_model_check",
            not report.problems.get("model_mismatch") and not wrong_dims,
            "model_mismatch",
            models=dg.MetadataValue.json(report.models),
            table_dims=report.table_dims,
            expected=f"{ident.model} ({ident.dims} dims)",
        ),
        result(
            "index_coverage_threshold_check",
            report.coverage_ratio >= settings.checks.min_coverage,
            "failed",
            coverage=round(report.coverage_ratio, 4),
            min_coverage=settings.checks.min_coverage,
        ),
        result(
            "index_coverage_fts_current_check",
            report.table_rows == 0 or report.fts_indexed,
            None,
            unindexed_rows=report.fts_unindexed_rows,
        ),
    ]
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
            "summary": dg.MetadataValue.md("\n".join(table)),
            "database": str(report.path),
        },
        check_results=checks,
    )


index_assets = [source_files, extracted_content, memory_chunks, chunk_embeddings, memory_vectors, index_coverage]
