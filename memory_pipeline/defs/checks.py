"""Asset checks on index_coverage: orphans, duplicates, one model, coverage, full-text index.

The checks run after index_coverage in every index run, and also on their own (the
UI's "Execute" on a check, or a run that selects only checks): each evaluation reads
the current LanceDB table and manifests through DuckDB (``refresh_analytics``), so it
judges the index as it is now, not as the last materialization saw it.
"""

from typing import TYPE_CHECKING

import dagster as dg

from memory_pipeline.defs.resources import EmbedderResource, MemoryConfigResource

if TYPE_CHECKING:
    from memory_pipeline.changes import EmbeddingIdentity
    from memory_pipeline.stores.analytics import CoverageReport

COVERAGE = dg.AssetKey("index_coverage")
_MAX_PATHS = 200

# name: (blocking, description). A blocking check that fails fails the run.
CHECKS = {
    "index_coverage_no_orphans_check": (True, "no table rows of files that are gone"),
    "index_coverage_no_duplicates_check": (True, "every chunk id is stored once"),
    "index_coverage_single_model_check": (True, "one model and dimension in the table, the configured one"),
    "index_coverage_threshold_check": (False, "indexed files / indexable files >= checks.min_coverage"),
    "index_coverage_fts_current_check": (
        False,
        "the full-text index exists (rows added since its last fold, unindexed_rows, are searched by a scan until the next)",
    ),
    "index_coverage_rows_present_check": (False, "every file recorded as indexed has all its rows in the table"),
}
# What a failed check's result says to do (its description, beside the first problem's detail).
REMEDY = {
    "index_coverage_no_orphans_check": "the next `memory index` removes them; `memory index --force` rewrites every shard",
    "index_coverage_no_duplicates_check": "`memory index --force` rewrites the shards whole, which stores each chunk once",
    "index_coverage_single_model_check": "`memory index --force` rebuilds the table with the configured model",
    "index_coverage_threshold_check": "`memory analytics` lists the files not indexed and why",
    "index_coverage_rows_present_check": "the next `memory index` (or a run of the file's shard) writes them again",
}


def evaluate(report: "CoverageReport", ident: "EmbeddingIdentity", min_coverage: float) -> list[dg.AssetCheckResult]:
    """Every check's result for a coverage report."""

    def result(name: str, passed: bool, kind: str | tuple[str, ...] | None = None, **extra) -> dg.AssetCheckResult:
        kinds = (kind,) if isinstance(kind, str) else tuple(kind or ())
        paths = sorted({p for k in kinds for p in report.paths(k)})
        meta = {"offending_paths": dg.MetadataValue.json(paths[:_MAX_PATHS]), "count": len(paths), **extra}
        description = None
        if not passed:
            first = next((report.problems[k][0] for k in kinds if report.problems.get(k)), {})
            what = f"{len(paths)} file(s), e.g. {first.get('path')}: {first.get('detail')}" if first else CHECKS[name][1]
            description = f"{what}. {REMEDY[name]}" if name in REMEDY else what
        return dg.AssetCheckResult(asset_key=COVERAGE, check_name=name, passed=passed, metadata=meta, description=description)

    wrong_dims = report.table_rows > 0 and report.table_dims != ident.dims
    return [
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
            report.coverage_ratio >= min_coverage,
            ("failed", "missing_rows"),  # every file that counts against coverage and has a problem row
            coverage=round(report.coverage_ratio, 4),
            min_coverage=min_coverage,
        ),
        result(
            "index_coverage_fts_current_check",
            report.table_rows == 0 or report.fts_indexed,
            None,
            unindexed_rows=report.fts_unindexed_rows,
        ),
        result("index_coverage_rows_present_check", not report.problems.get("missing_rows"), "missing_rows"),
    ]


@dg.multi_asset_check(
    specs=[dg.AssetCheckSpec(name, asset=COVERAGE, blocking=blocking, description=desc) for name, (blocking, desc) in CHECKS.items()],
    can_subset=True,
    description="The index's faults, judged on the current table and manifests (one DuckDB refresh for all checks).",
)
def index_coverage_checks(context: dg.AssetCheckExecutionContext, memory_config: MemoryConfigResource, embedder: EmbedderResource):
    settings = memory_config.settings()
    ident = embedder.identity(settings)
    report = memory_config.coverage(settings, ident)
    selected = {key.name for key in context.selected_asset_check_keys}
    for result in evaluate(report, ident, settings.checks.min_coverage):
        if result.check_name in selected:
            yield result
