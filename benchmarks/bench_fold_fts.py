#!/usr/bin/env python
"""What a fold costs a table that has its full-text index (issue 16): LanceDB's ``optimize`` folds
new rows into every index, and into a full-text index by rewriting it.

    .venv/bin/python benchmarks/bench_fold_fts.py --rows 262144,1000000 --folds 3 --out benchmarks/results-fold-fts.json

Per table size, in a fresh process each: a synthetic table of that many rows (rounded up to a
multiple of 16,384, the batches it is written in) of 40 words each
(Zipf-distributed over 20,000 words), its full-text index built with the product's settings (token
positions, ICU tokenizer, stemming, 32 MiB of postings, one worker), then ``--folds`` times a
segment of 65,536 new rows added and folded by ``optimize``. LanceDB's caches are bounded to 16 MiB
each, as a run's writing store bounds them. Reported: the build's and each fold's growth of the
process over its floor (VmHWM reset through ``/proc/self/clear_refs`` after the heap is trimmed),
and their wall time. No vector index: this is the full-text part of a fold alone.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEGMENT = 65_536
STEP = 16_384


def _rss() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) // 1024
    return out


def _reset() -> None:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")


def one(rows: int, folds: int) -> dict:
    os.environ.setdefault("LANCE_FTS_PARTITION_SIZE", "32")
    import lancedb
    import numpy as np
    import pyarrow as pa
    from lancedb.index import FTS

    rng = np.random.default_rng(0)
    vocab = np.array([f"w{i}" for i in range(20_000)])
    size = 16 * 2**20
    workdir = tempfile.mkdtemp()
    db = lancedb.connect(workdir, session=lancedb.Session(index_cache_size_bytes=size, metadata_cache_size_bytes=size))
    table = None

    def add(start: int, n: int) -> None:
        nonlocal table
        for s in range(start, start + n, STEP):
            words = rng.zipf(1.3, size=(STEP, 40)) % len(vocab)
            batch = pa.table({"id": pa.array(np.arange(s, s + STEP)), "text": pa.array([" ".join(vocab[w]) for w in words])})
            if table is None:
                table = db.create_table("t", batch)
            else:
                table.add(batch)

    add(0, rows)
    assert table is not None
    table.optimize()
    _reset()
    floor, started = _rss()["VmRSS"], time.perf_counter()
    config = FTS(
        with_position=True, base_tokenizer="icu", language="English", stem=True, remove_stop_words=False, ascii_folding=True, memory_limit=32, num_workers=1
    )
    table.create_index("text", config=config)
    out = {"rows": table.count_rows(), "build_mb": _rss()["VmHWM"] - floor, "build_s": round(time.perf_counter() - started, 1), "folds": []}
    for k in range(folds):
        add(rows + k * SEGMENT, SEGMENT)
        _reset()
        floor, started = _rss()["VmRSS"], time.perf_counter()
        table.optimize()
        out["folds"].append(
            {"rows_after": table.count_rows(), "floor_mb": floor, "grew_mb": _rss()["VmHWM"] - floor, "s": round(time.perf_counter() - started, 1)}
        )
    shutil.rmtree(workdir, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="262144,1000000")
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results-fold-fts.json"))
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a size, in this (fresh) process
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.folds)))
        return 0
    sizes = []
    for rows in (int(x) for x in args.rows.split(",") if x.strip()):
        proc = subprocess.run([sys.executable, __file__, "--one", str(rows), "--folds", str(args.folds)], capture_output=True, text=True, check=True)
        sizes.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"[bench_fold_fts] {json.dumps(sizes[-1])}", file=sys.stderr, flush=True)
    out = {
        "benchmark": "full-text part of a fold (benchmarks/bench_fold_fts.py)",
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "loadavg": list(os.getloadavg())},
        "segment_rows": SEGMENT,
        "sizes": sizes,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
