#!/usr/bin/env python
"""Load benchmark of `memory serve` (loopback only, bounded in time).

    .venv/bin/python benchmarks/bench_service.py --out benchmarks/results-service.json [--notes 400] [--seconds 60]

1. Builds a synthetic memory folder (``--notes`` notes of several sections each, fixed seed) and
   indexes it with `memory index` (the local model: real embeddings).
2. Starts `memory serve --port 0` in a subprocess and waits for /readyz.
3. Concurrency 1: one client searches for ``--c1-seconds`` (query embedding included).
4. Concurrency 16 with nothing writing, for ``--alone-seconds`` (the server's own capacity); then
   16 clients search for ``--seconds`` while another client ingests documents through
   /api/agentos/rag/multimodal/documents/ingest and a `memory index` runs over new notes.
5. ``--cli-runs`` fresh `memory search` processes with the server up (the light path).

``--keep DIR`` copies the indexed folder (notes and data folder) to DIR before the server starts;
``--from DIR`` starts from a copy of such a folder instead of building one, so step 1's `memory
index` finds nothing to do (its seconds say so) and the phases can be measured again without
re-embedding 100k chunks. The writers' phase always works on the copy.

Reports errors, p50/p95/p99 and searches/s per phase, and the CLI p50; writes JSON to ``--out``.
Targets (issue 14, 2 cores, 100k chunks): p50 <= 30 ms and p99 <= 150 ms at c=1; >= 50 searches/s at
c=16; CLI p50 <= 300 ms. Clients run in this process (threads), on the same cores as the server.

At 100k chunks (``--scale-files 10000``: bench_scale.py's notes of ten short sections, chunked at
64 tokens, about ten chunks a note) embedding the folder with the local model takes about 12
minutes here (726 s measured); ``--embedder fake-openai`` instead embeds with the tests' fake of
OpenAI's embeddings endpoint on 127.0.0.1 (bag-of-words vectors, 384 dims, through the real
`openai` SDK), for the index and for every query: the table, its FTS and ANN indices, the server
and the clients are the product as it runs, but each query's embedding is then a loopback HTTP
call to a Python server in this process (about 1.5 ms p50) instead of the local model (2.5 ms
p50 and 3.7 ms of CPU, bench_search.py), so its numbers are not the issue's, which name the
local model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

WORDS = ("courier route warehouse scanner invoice receipt standup deploy rollback database vector search model budget "
         "finance travel lisbon rotterdam harbour crane inspection pilot review async pager oncall incident latency "
         "throughput dashboard roadmap optimizer mobile app payment gateway refund customer support ticket escalation "
         "contract penalty agreement quarterly revenue target hiring interview onboarding laptop security audit").split()  # fmt: skip
NAMES = ["Dana", "Ravi", "Mei", "Tomasz", "Aisha", "Lars", "Inés", "Kofi"]


EXTRA_ENV: dict[str, str] = {}  # the fake endpoint's key, with --embedder fake-openai


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("MEMORY_PIPELINE_CONFIG", "MEMORY_PIPELINE_TOKEN")}
    e.update(HF_HUB_OFFLINE="1", DAGSTER_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false", **EXTRA_ENV)
    return e


def memory(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memory_pipeline.cli", *args], cwd=cwd, env=env(), capture_output=True, text=True)


def sentence(rng: random.Random) -> str:
    return f"{rng.choice(NAMES)} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))) + f" PAY-{rng.randint(1000, 9999)}."


def write_notes(mem: Path, n: int, rng: random.Random, prefix: str = "") -> None:
    for i in range(n):
        day = f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}"
        sections = "\n\n".join(f"## {rng.choice(WORDS).title()} {j}\n" + " ".join(sentence(rng) for _ in range(rng.randint(6, 12)))
                               for j in range(rng.randint(3, 6)))  # fmt: skip
        (mem / f"{prefix}{day}-{i:05d}.md").write_text(f"# Note {i}\n\n{sections}\n")


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] * 1000, 1)


def summary(lat: list[float], errors: int, seconds: float) -> dict:
    return {"searches": len(lat), "errors": errors, "seconds": round(seconds, 1), "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95),
            "p99_ms": pct(lat, 99), "searches_per_s": round(len(lat) / seconds, 1) if seconds else None}  # fmt: skip


def run_clients(url: str, queries: list[str], clients: int, seconds: float) -> dict:
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(k: int) -> None:
        rng = random.Random(k)
        with httpx.Client(base_url=url, timeout=60) as http:
            while time.monotonic() < deadline:
                q = rng.choice(queries)
                t = time.perf_counter()
                try:
                    ok = http.post("/api/memory/search", json={"query": q}).status_code == 200
                except httpx.HTTPError:
                    ok = False
                dt = time.perf_counter() - t
                with lock:
                    (lat.append(dt) if ok else None)
                    errors[0] += 0 if ok else 1

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summary(lat, errors[0], time.monotonic() - start)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results-service.json")
    ap.add_argument("--notes", type=int, default=400)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--c1-seconds", type=float, default=15)
    ap.add_argument("--cli-runs", type=int, default=10)
    ap.add_argument("--alone-seconds", type=float, default=30, help="c=16 with nothing writing, before the writers' phase (0: skip)")
    ap.add_argument("--embedder", choices=("local", "fake-openai"), default="local", help="see the module docstring")
    ap.add_argument("--scale-files", type=int, default=0, help="bench_scale.py's folder of N notes (~10 chunks each) instead of --notes")
    ap.add_argument("--keep", type=Path, help="copy the indexed folder here (for --from)")
    ap.add_argument("--from", dest="from_dir", type=Path, help="start from a folder --keep left (same --notes/--scale-files/--embedder)")
    args = ap.parse_args()
    fake = None
    if args.embedder == "fake-openai":
        import collections

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from memory_pipeline_tests.fakes.openai_server import OpenAIFake

        fake = OpenAIFake(dims=384)
        fake.requests = collections.deque(maxlen=16)  # type: ignore[assignment] - keep memory flat
        fake.__enter__()
        EXTRA_ENV["OPENAI_API_KEY"] = fake.api_key or ""
    try:
        return _main(args, fake)
    finally:
        if fake is not None:
            fake.__exit__(None, None, None)


def _main(args, fake) -> int:
    rng = random.Random(14)
    queries = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) for _ in range(200)]
    out: dict = {"started_at": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.machine(),
                 "cpus": os.cpu_count(), "notes": args.scale_files or args.notes, "embedder": args.embedder}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
        root = Path(tmp)
        mem = root / "mem"
        mem.mkdir()
        if args.from_dir:
            shutil.copytree(args.from_dir / "mem", mem, dirs_exist_ok=True)
            shutil.copytree(args.from_dir / "index", root / "index", ignore=shutil.ignore_patterns("server.json"))
            out["from"] = str(args.from_dir)
        elif args.scale_files:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from bench_scale import make_folder

            make_folder(mem, args.scale_files, seed=args.scale_files)
        else:
            write_notes(mem, args.notes, rng)
        cfg = root / "memory_pipeline.yaml"
        provider = "provider: local\n"
        if fake is not None:
            provider = f"provider: openai\nmodel: text-embedding-3-small\ndims: 384\nremote:\n  base_url: {fake.base_url}\n  concurrency: 4\n"
        chunking = "chunking:\n  tokens: 64\n  overlap: 0\n" if args.scale_files else ""
        cfg.write_text("data_dir: index\nsources: [{name: mem, path: mem}]\n" + provider + chunking)
        t = time.perf_counter()
        done = memory("index", "--config", str(cfg), "--json", cwd=root)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        index = json.loads(done.stdout)
        out["index"] = {"seconds": round(time.perf_counter() - t, 1), "chunks": index["table_rows"]}
        print(f"indexed {out['notes']} notes: {index['table_rows']} chunks in {out['index']['seconds']} s", flush=True)
        if args.keep:
            shutil.rmtree(args.keep, ignore_errors=True)
            shutil.copytree(mem, args.keep / "mem")
            shutil.copytree(root / "index", args.keep / "index")
        log = open(root / "serve.log", "w")
        server = subprocess.Popen([sys.executable, "-m", "memory_pipeline.cli", "serve", "--config", str(cfg), "--port", "0"],
                                  cwd=root, env=env(), stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            record_path = root / "index" / "server.json"
            while not record_path.is_file():
                if server.poll() is not None:
                    raise SystemExit("memory serve exited: " + (root / "serve.log").read_text())
                time.sleep(0.1)
            url = json.loads(record_path.read_text())["url"]
            t = time.perf_counter()
            while httpx.get(f"{url}/readyz").status_code != 200:
                time.sleep(0.2)
            out["server_ready_seconds"] = round(time.perf_counter() - t, 1)
            run_clients(url, queries[:20], 1, 3)  # warm-up
            out["c1"] = run_clients(url, queries, 1, args.c1_seconds)
            print("c=1", out["c1"], flush=True)
            if args.alone_seconds > 0:
                # The server's own capacity: 16 clients and nothing writing (what the writers of the
                # next phase take from the two cores shows as the difference).
                out["c16_searches_only"] = run_clients(url, queries, 16, args.alone_seconds)
                print("c=16, searches only", out["c16_searches_only"], flush=True)

            # c=16 while an ingest client and a `memory index` write.
            stop = threading.Event()
            ingest = {"ingested": 0, "errors": 0}

            def ingester() -> None:
                k = 0
                with httpx.Client(base_url=url, timeout=600) as http:
                    while not stop.is_set():
                        body = (" ".join(sentence(rng) for _ in range(20)) + f" bench-{k}\n").encode()
                        resp = http.post("/api/agentos/rag/multimodal/documents/ingest", files={"document": (f"bench-{k}.txt", body, "text/plain")})
                        ingest["ingested" if resp.status_code == 200 else "errors"] += 1
                        k += 1

            write_notes(mem, max(20, args.notes // 10), random.Random(99), prefix="new-")
            writer = threading.Thread(target=ingester)
            writer.start()
            t_index = time.perf_counter()
            indexer = subprocess.Popen([sys.executable, "-m", "memory_pipeline.cli", "index", "--config", str(cfg), "--quiet"],
                                       cwd=root, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
            out["c16"] = run_clients(url, queries, 16, args.seconds)
            stop.set()
            writer.join()
            _, index_err = indexer.communicate()
            out["c16"]["concurrent_ingest"] = ingest
            out["c16"]["concurrent_index"] = {"exit": indexer.returncode, "seconds": round(time.perf_counter() - t_index, 1), "stderr": index_err[-300:]}
            print("c=16", out["c16"], flush=True)

            cli = []
            for q in queries[: args.cli_runs]:
                t = time.perf_counter()
                r = memory("search", "--config", str(cfg), q, "--json", cwd=root)
                cli.append(time.perf_counter() - t)
                if r.returncode != 0:
                    out.setdefault("cli_errors", []).append(r.stderr[-200:])
            if cli:  # --cli-runs 0 skips it
                out["cli_fresh_process"] = {"runs": len(cli), "p50_ms": pct(cli, 50), "max_ms": round(max(cli) * 1000, 1)}
            print("cli", out["cli_fresh_process"], flush=True)
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.close()
    out["load_average"] = os.getloadavg()
    out["targets"] = {"c1_p50_ms": 30, "c1_p99_ms": 150, "c16_searches_per_s": 50, "cli_p50_ms": 300, "chunks": 100000}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
