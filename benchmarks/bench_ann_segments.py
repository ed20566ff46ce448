#!/usr/bin/env python
"""The vector index built whole against built a segment at a time (issue 16's flat memory).

    .venv/bin/python benchmarks/bench_ann_segments.py --rows 1000000 --out benchmarks/results-ann-segments.json

A table of ``--rows`` clustered unit vectors (384 dimensions, 2,000 Gaussian clusters, the same
seed each time) is written in commits of 4,096 rows (16 per segment), as the write stage commits slices of files, and its
`IVF_HNSW_SQ` index is made the two ways the product can:

- ``whole``: every row written, then ``VectorStore.ensure_ann`` builds the index over the table in
  one LanceDB call (what a run did before 2026-12-06);
- ``segments``: ``VectorStore.fold_segment`` after each ``SEGMENT_ROWS`` rows written (what the
  write stage does now): the index is built over the first segment, each later one is folded in as
  a delta index over just its rows.

Each way runs in a fresh process (``--mode`` runs one) that reports its resident size before each
index step and the step's peak (``/proc/self/statm`` polled every 20 ms), the build time, and
VmHWM. Then both tables answer the same 100 queries (perturbed cluster centres) through the
product's ANN knobs (``ann.nprobes`` 20, ``refine_factor`` 20): recall@10 against exact search on
the same table, and p50 / p95 latency (the second of two runs of each query). The vectors are
synthetic: recall and latency here compare the two index shapes, not models.

``--modes segments`` builds one way only; with ``--segment-rows`` and a ``--min-rows`` at most that,
it measures what a segment's size costs (a fold's growth, the deltas a query searches):

    .venv/bin/python benchmarks/bench_ann_segments.py --rows 262144 --min-rows 16384 --modes segments --segment-rows 32768 --out benchmarks/results-ann-segment-size-32768.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DIMS = 384
SLICE = 4_096  # rows per commit: 16 commits per segment, as the write stage commits slices of files
CLUSTERS = 2000


def _rss_mb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20


def _hwm_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # KiB on Linux


def _centers():
    import numpy as np

    return np.random.default_rng(0).standard_normal((CLUSTERS, DIMS)).astype(np.float32)


def _vectors(seed: int, n: int, centers):
    import numpy as np

    rng = np.random.default_rng(seed)
    v = centers[rng.integers(0, CLUSTERS, n)] + 0.6 * rng.standard_normal((n, DIMS)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def build(mode: str, rows: int, path: Path, *, segment_rows: int, min_rows: int, slice_rows: int = SLICE) -> dict:
    """One way of building, in this process: the table written slice by slice, the index made."""
    import pyarrow as pa

    from memory_pipeline.settings import AnnConfig
    from memory_pipeline.stores import lance
    from memory_pipeline.stores.lance import VectorStore, table_schema

    lance.SEGMENT_ROWS = segment_rows  # the product's default unless asked (the tests ask for small ones)
    shutil.rmtree(path, ignore_errors=True)
    peak = [0]

    def poll() -> None:
        while True:
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.02)

    threading.Thread(target=poll, daemon=True).start()
    meta = {"provider": "bench", "model": "synthetic", "dims": DIMS, "provider_key": "bench"}
    store = VectorStore(str(path), "memory_vectors")
    table = store.ensure(DIMS, meta)
    schema = table_schema(DIMS, meta)
    ann = AnnConfig(min_rows=min_rows, index_type="IVF_HNSW_SQ")
    centers = _centers()
    steps: list[dict] = []
    pending = 0
    started = time.perf_counter()

    def step(what) -> None:
        base = _rss_mb()
        peak[0] = base
        t0 = time.perf_counter()
        done = what()
        steps.append(
            {"rows": store.count_rows(), "rss_before_mb": base, "peak_mb": peak[0], "seconds": round(time.perf_counter() - t0, 1), "ann": done.get("ann", "")}
        )
        print(json.dumps(steps[-1]), flush=True)

    for start in range(0, rows, slice_rows):
        n = min(slice_rows, rows - start)
        vecs = _vectors(start, n, centers)
        cols = {f.name: pa.nulls(n, f.type) for f in schema}
        cols["chunk_id"] = pa.array([f"c{start + k:07d}" for k in range(n)])
        cols["doc_id"] = pa.array([f"bench:d{(start + k) // 10}" for k in range(n)])
        cols["vector"] = pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1)), DIMS)
        table.add(pa.table(cols, schema=schema))
        del vecs, cols
        pending += n
        if mode == "segments" and pending >= lance.SEGMENT_ROWS:
            pending = 0
            step(lambda: store.fold_segment(ann))
    if mode == "whole" or pending:
        step(lambda: store.ensure_ann(ann, fold_rest=mode == "segments"))
    index = store.vector_index()
    stats = table.index_stats(index.name) if index is not None else None
    assert stats is not None, "no vector index was built"
    return {
        "mode": mode, "rows": rows, "segment_rows": lance.SEGMENT_ROWS, "wall_s": round(time.perf_counter() - started, 1),
        "index_s": round(sum(s["seconds"] for s in steps), 1), "index_steps": len(steps),
        "largest_step_growth_mb": max(s["peak_mb"] - s["rss_before_mb"] for s in steps),
        "peak_mb": max(s["peak_mb"] for s in steps), "vm_hwm_mb": _hwm_mb(),
        "delta_indices": int(stats.num_indices or 0), "indexed_rows": int(stats.num_indexed_rows or 0), "steps": steps,
    }  # fmt: skip


def measure(path: Path, queries: int = 100, min_rows: int = 50_000) -> dict:
    """Recall@10 against exact search and latency of the product's ANN query on one table."""
    import numpy as np

    from memory_pipeline.settings import AnnConfig
    from memory_pipeline.stores.lance import VectorStore, ann_query

    table = VectorStore(str(path), "memory_vectors").open()
    assert table is not None, f"no table at {path}"
    ann = AnnConfig(min_rows=min_rows, index_type="IVF_HNSW_SQ")
    rng = np.random.default_rng(7)
    qs = _centers()[rng.integers(0, CLUSTERS, queries)] + 0.6 * rng.standard_normal((queries, DIMS)).astype(np.float32)
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)

    def ids(q) -> list[str]:
        return q.select(["chunk_id", "_distance"]).to_arrow().column("chunk_id").to_pylist()

    recall, lat = [], []
    for q in qs:
        exact = set(ids(table.search(q).distance_type("cosine").bypass_vector_index().limit(10)))  # pyright: ignore[reportAttributeAccessIssue]
        for _ in range(2):
            t0 = time.perf_counter()
            got = ids(ann_query(table.search(q).distance_type("cosine"), ann, 10).limit(10))  # pyright: ignore[reportAttributeAccessIssue]
            dt = time.perf_counter() - t0
        lat.append(dt * 1000)
        recall.append(len(exact & set(got)) / 10)
    return {
        "recall_at_10": round(float(np.mean(recall)), 4),
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p95_ms": round(float(np.percentile(lat, 95)), 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--segment-rows", type=int, default=None, help="rows per segment (default: the product's SEGMENT_ROWS)")
    ap.add_argument("--min-rows", type=int, default=50_000, help="ann.min_rows")
    ap.add_argument("--slice-rows", type=int, default=SLICE, help="rows per commit")
    ap.add_argument("--work-dir", type=Path, default=ROOT / "benchmarks" / "work" / "ann-segments")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--mode", choices=["whole", "segments"], help="one build in this process (used by the run)")
    ap.add_argument("--modes", default="whole,segments", help="the ways to build, each in a fresh process (default: both)")
    args = ap.parse_args()
    os.environ.setdefault("LANCEDB_LOG", "error")
    if args.mode:
        from memory_pipeline.stores import lance

        seg = args.segment_rows or lance.SEGMENT_ROWS
        got = build(args.mode, args.rows, args.work_dir / args.mode, segment_rows=seg, min_rows=args.min_rows, slice_rows=args.slice_rows)
        print("RESULT " + json.dumps(got), flush=True)
        return 0
    results: dict = {"rows": args.rows, "dims": DIMS, "date": time.strftime("%Y-%m-%d"), "cpu": _cpu()}
    modes = [m for m in ("whole", "segments") if m in args.modes.split(",")]
    for mode in modes:
        argv = [
            "--rows",
            str(args.rows),
            "--work-dir",
            str(args.work_dir),
            "--min-rows",
            str(args.min_rows),
            "--slice-rows",
            str(args.slice_rows),
            "--mode",
            mode,
        ]
        if args.segment_rows:
            argv += ["--segment-rows", str(args.segment_rows)]
        proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode or line is None:
            print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
            return 1
        results[mode] = json.loads(line[len("RESULT ") :])
        print(mode, {k: v for k, v in results[mode].items() if k != "steps"}, flush=True)
    for mode in modes:
        results[mode]["search"] = measure(args.work_dir / mode, min_rows=args.min_rows)
        print(mode, results[mode]["search"], flush=True)
    shutil.rmtree(args.work_dir, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


if __name__ == "__main__":
    sys.exit(main())
