#!/usr/bin/env python
"""Write latency of `memory serve`: AgentOS document ingest, note write and asset delete, each ending
with its index run (loopback only, sequential, one client).

    .venv/bin/python benchmarks/bench_ingest.py --root /tmp/bench-ingest [--notes 300] [--writes 8] [--code DIR] [--out FILE]

1. Builds ``--root`` once (``--notes`` synthetic notes, fixed seed, indexed with `memory index`, the
   local model); later calls reuse it, so two versions of the code can be measured on one memory.
2. Starts `memory serve --port 0` from ``--code`` (default: this checkout; e.g. a `git archive` of an
   older commit, to measure before/after) and waits for /readyz.
3. ``--writes`` times each: ingest a new small text document, write a new note, delete the ingested
   asset (each answer comes after its index run). Reports p50/mean/max per kind; JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_service import env, memory, sentence, write_notes  # noqa: E402

RAG = "/api/agentos/rag/multimodal"


def build(root: Path, notes: int) -> None:
    cfg = root / "memory_pipeline.yaml"
    if cfg.is_file():
        return
    mem = root / "mem"
    mem.mkdir(parents=True)
    write_notes(mem, notes, random.Random(14))
    cfg.write_text("data_dir: index\nsources: [{name: mem, path: mem}]\nprovider: local\n")
    t = time.perf_counter()
    done = memory("index", "--config", str(cfg), "--json", cwd=root)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    print(f"indexed {notes} notes: {json.loads(done.stdout)['table_rows']} chunks in {time.perf_counter() - t:.1f} s", flush=True)


def stats(values: list[float]) -> dict:
    ms = sorted(v * 1000 for v in values)
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1), "mean_ms": round(statistics.fmean(ms), 1), "max_ms": round(ms[-1], 1)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--notes", type=int, default=300)
    ap.add_argument("--writes", type=int, default=8)
    ap.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1], help="the memory_pipeline checkout to serve from")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    root = args.root.resolve()
    build(root, args.notes)
    cfg = root / "memory_pipeline.yaml"
    server_env = env() | {"PYTHONPATH": str(args.code.resolve())}
    log = open(root / "serve.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "memory_pipeline.cli", "serve", "--config", str(cfg), "--port", "0"],
                              cwd=root, env=server_env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    out: dict = {"code": str(args.code.resolve()), "notes": args.notes, "load_average_before": os.getloadavg()}
    try:
        record = root / "index" / "server.json"
        while not (record.is_file() and json.loads(record.read_text()).get("pid") == server.pid):
            if server.poll() is not None:
                raise SystemExit("memory serve exited: " + (root / "serve.log").read_text())
            time.sleep(0.1)
        url = json.loads(record.read_text())["url"]
        with httpx.Client(base_url=url, timeout=600) as http:
            while http.get("/readyz").status_code != 200:
                time.sleep(0.2)
            out["table_rows"] = http.get("/api/memory/status").json()["table"]["rows"]
            rng = random.Random(time.time_ns())
            times: dict[str, list[float]] = {"ingest": [], "note": [], "delete": []}
            shards: dict[str, list] = {"ingest": [], "note": []}
            for k in range(args.writes):
                tag = f"bench{rng.randrange(10**9)}"
                body = (" ".join(sentence(rng) for _ in range(6)) + f" {tag}\n").encode()
                t = time.perf_counter()
                resp = http.post(f"{RAG}/documents/ingest", files={"document": (f"{tag}.txt", body, "text/plain")})
                times["ingest"].append(time.perf_counter() - t)
                resp.raise_for_status()
                asset = resp.json()["assetId"]
                shards["ingest"].append(http.get("/api/memory/status").json()["last_run"].get("shards"))
                t = time.perf_counter()
                resp = http.post("/api/memory/notes", json={"text": " ".join(sentence(rng) for _ in range(4)), "path": f"bench/{tag}.md"})
                times["note"].append(time.perf_counter() - t)
                resp.raise_for_status()
                shards["note"].append((resp.json().get("run") or {}).get("shards"))
                t = time.perf_counter()
                http.delete(f"{RAG}/assets/{asset}").raise_for_status()
                times["delete"].append(time.perf_counter() - t)
                print(k, {kind: round(v[-1] * 1000) for kind, v in times.items()}, flush=True)
            out |= {kind: stats(v) for kind, v in times.items()}
            out["shards_per_run"] = {kind: [len(s) if s else 16 for s in v] for kind, v in shards.items()}
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    out["load_average_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
