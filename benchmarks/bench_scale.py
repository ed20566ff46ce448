#!/usr/bin/env python
"""Scale benchmark of the pipeline (issue 16): `memory index` at 10k, 100k and 1M chunks.

    .venv/bin/python benchmarks/bench_scale.py --files 1000,10000,100000 --out benchmarks/results-scale.json

Each size is a generated folder of N notes of ten short sections each (chunking set to 64 tokens,
so about ten chunks a note: 1,000 notes give about 10,000 chunks). Embedding a million chunks with
the local model would take hours on this machine, so the scale runs embed with a cheap
deterministic embedder: the tests' fake of OpenAI's embeddings endpoint (bag-of-words vectors,
384 dims) on 127.0.0.1, driven by the real `openai` SDK through `provider: openai`. Everything
else is the product as it runs: a fresh `memory index` process per run, the real stages, LanceDB
table, FTS and ANN indices (the ANN index is built once the table holds `ann.min_rows` rows).

Per size: index wall time and peak RSS of the fresh process, chunks, table size on disk, and a
no-op re-run as a fresh process (targets: peak RSS <= 1.5 GB and flat across sizes; the no-op of
100,000 files <= 30 s). Search latency and ANN recall at scale, with real query embeddings, are
`benchmarks/bench_search.py --chunks 1000000`. ``--max-minutes`` bounds the run: a size that
would start after the budget is skipped and recorded as such.

``--grow N`` (the largest size only): after its no-op re-run, N more notes are added to the folder
and indexed by a fresh process: a run that adds many rows to a table that already has its
full-text and vector indices, as an archive imported at once does. Its wall time, peak RSS and
each index's rows indexed, not indexed and delta indices afterwards are recorded under ``grow``.

    .venv/bin/python benchmarks/bench_scale.py --files 10000 --grow 30000 --out benchmarks/results-scale-grow.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_index import WRAPPER  # noqa: E402

from memory_pipeline_tests.fakes.openai_server import OpenAIFake  # noqa: E402

BIN = Path(sys.executable).parent
RSS_MAX_MB = 1536.0
NOOP_MAX_S = 30.0
WORDS = (
    "agent memory vector search note meeting budget deploy rollback cache queue schema index shard worker "
    "postgres redis celery lance dagster billing invoice customer ticket outage alert metric latency"
).split()


def make_folder(root: Path, n_files: int, seed: int) -> int:
    """N notes of ten sections of 25-35 words; total bytes."""
    rng = random.Random(seed)
    total = 0
    for i in range(n_files):
        folder = root / f"{i // 1000:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        parts = [f"# Note {i}"]
        for j in range(10):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(25, 35)))
            parts.append(f"## Part {j}\n\n{words} {i}-{j}.")
        text = "\n\n".join(parts) + "\n"
        (folder / f"note-{i:06d}.md").write_text(text, encoding="utf-8")
        total += len(text)
    return total


SUMMARY_KEYS = ("files_seen", "files_changed", "chunks_total", "chunks_embedded", "rows_written", "table_rows", "seconds")


def measured(cmd: list[str], env: dict, timeout: float) -> dict:
    fd, usage_path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", WRAPPER, usage_path, *cmd], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    usage = json.loads(Path(usage_path).read_text() or "{}")
    Path(usage_path).unlink(missing_ok=True)
    out = {
        "rc": proc.returncode,
        "wall_s": round(usage.get("wall_s", time.perf_counter() - started), 2),
        "peak_rss_mb": round(usage.get("maxrss_kb", 0) / 1024, 1),
        "cpu_s": round(usage.get("user_s", 0) + usage.get("sys_s", 0), 1),
    }
    if proc.returncode != 0:
        out["stderr_tail"] = proc.stderr[-3000:]
        return out
    try:
        summary = json.loads(proc.stdout[proc.stdout.index("{") :])
        out["summary"] = {k: summary.get(k) for k in SUMMARY_KEYS}
    except (ValueError, json.JSONDecodeError) as err:
        out["stdout_tail"] = f"unreadable summary ({err}): {proc.stdout[-1000:]}"
    return out


def index_stats(lancedb_dir: Path) -> dict:
    """Each index of the table: rows indexed and not, and its delta indices (what a run folded)."""
    import lancedb

    table = lancedb.connect(str(lancedb_dir)).open_table("memory_vectors")
    out = {}
    for idx in table.list_indices():
        stats = table.index_stats(idx.name)
        out[idx.name] = {"indexed_rows": stats.num_indexed_rows, "unindexed_rows": stats.num_unindexed_rows, "indices": stats.num_indices}
    return out


def bench_size(work: Path, n_files: int, fake: OpenAIFake, timeout: float, grow: int = 0) -> dict:
    root = work / f"files-{n_files}"
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    size = make_folder(root / "mem", n_files, seed=n_files)
    generate_s = time.perf_counter() - t0
    config = root / "memory_pipeline.yaml"
    config.write_text(
        "data_dir: index\n"
        "sources:\n  - name: mem\n    path: mem\n"
        "provider: openai\nmodel: text-embedding-3-small\ndims: 384\n"
        f"remote:\n  base_url: {fake.base_url}\n  concurrency: 4\n"
        "chunking:\n  tokens: 64\n  overlap: 0\n"
    )
    env = {**os.environ, "OPENAI_API_KEY": fake.api_key or "", "HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1"}
    cmd = [str(BIN / "memory"), "index", "--config", str(config), "--json"]
    first = measured(cmd, env, timeout)
    result: dict = {"files": n_files, "bytes": size, "generate_s": round(generate_s, 1), "index": first}
    if first["rc"] == 0:
        result["noop"] = measured(cmd, env, timeout)
        lancedb = root / "index" / "lancedb"
        result["table_bytes_on_disk"] = sum(f.stat().st_size for f in lancedb.rglob("*") if f.is_file())
        result["chunks"] = (first.get("summary") or {}).get("chunks_total")
        if grow:
            # The folder grows by ``grow`` notes and is indexed again: a run that adds many rows to a
            # table that already has its full-text and vector indices (an archive imported at once).
            make_folder(root / "mem" / "grown", grow, seed=n_files + grow)
            result["grow"] = {"files_added": grow, **measured(cmd, env, timeout)}
            result["grow"]["indices"] = index_stats(root / "index" / "lancedb")
    shutil.rmtree(root, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", default="1000,10000,100000", help="folder sizes in notes (about ten chunks each)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results-scale.json"))
    ap.add_argument("--work-dir", default=str(REPO / "benchmarks" / "work" / "scale"))
    ap.add_argument("--grow", type=int, default=0, help="after the largest size, add this many notes and index again (0: not measured)")
    ap.add_argument("--max-minutes", type=float, default=90.0, help="sizes that would start after this are skipped")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.files.split(",") if x.strip()]
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.max_minutes * 60
    fake = OpenAIFake(dims=384)
    fake.requests = collections.deque(maxlen=16)  # type: ignore[assignment] - keep memory flat: only the last few requests
    results: list[dict] = []
    with fake:
        for n in sizes:
            left = deadline - time.monotonic()
            if left <= 0:
                results.append({"files": n, "skipped": f"not started: the {args.max_minutes:.0f}-minute budget was spent"})
                continue
            print(f"[bench_scale] {n} files", file=sys.stderr, flush=True)
            results.append(bench_size(work, n, fake, timeout=left, grow=args.grow if n == max(sizes) else 0))
            print(f"[bench_scale] {json.dumps(results[-1])[:400]}", file=sys.stderr, flush=True)
    done = [r for r in results if "index" in r and r["index"]["rc"] == 0]
    peaks = [r["index"]["peak_rss_mb"] for r in done]
    grown = [r["grow"]["peak_rss_mb"] for r in done if r.get("grow", {}).get("rc") == 0]
    largest = max(done, key=lambda r: r["files"], default=None)
    targets = {
        # Every run's peak, the grown folder's run included.
        "peak_rss_max_mb": {"threshold": RSS_MAX_MB, "measured": max(peaks + grown, default=None), "pass": bool(peaks) and max(peaks + grown) <= RSS_MAX_MB},
        "peak_rss_flat": {"measured": peaks, "growth": round(max(peaks) / min(peaks) - 1, 3) if peaks else None},
        "noop_100k_files_max_s": {
            "threshold": NOOP_MAX_S,
            "files": largest["files"] if largest else None,
            "measured": largest["noop"]["wall_s"] if largest and "noop" in largest else None,
            "pass": bool(largest and largest["files"] >= 100_000 and largest.get("noop", {}).get("wall_s", 1e9) <= NOOP_MAX_S),
        },
    }
    out = {
        "benchmark": "memory_pipeline scale (benchmarks/bench_scale.py)",
        "embedder": "fake OpenAI endpoint on 127.0.0.1 (bag-of-words vectors, 384 dims) through provider: openai; not the local model",
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "loadavg": list(os.getloadavg())},
        "sizes": results,
        "targets": targets,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(targets, indent=2))
    return 0 if all(r.get("index", {}).get("rc") == 0 and r.get("grow", {}).get("rc", 0) == 0 for r in results if "skipped" not in r) else 1


if __name__ == "__main__":
    sys.exit(main())
