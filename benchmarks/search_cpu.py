#!/usr/bin/env python
"""Where a search's CPU goes: each LanceDB call of a search, and the query embedding, one search at a time.

    .venv/bin/python benchmarks/search_cpu.py --config memory_pipeline.yaml [--queries FILE] [--seconds 20] [--out FILE.json]

A server's throughput is its searches' CPU: on 2 cores, 30 ms of CPU a search is at most about 65
searches/s, whatever the concurrency. Most of that CPU is spent in LanceDB's own threads (its
queries run there), which ``cProfile`` and ``time.thread_time`` do not see. This runs the
searches of ``--queries`` (one per line; default: the 200 queries ``bench_service.py`` sends)
with the searcher's full-text leg on the calling thread (nothing overlaps), through the server's
``WarmSearcher`` (so a table that changes meanwhile is followed as the server follows it), and
charges each LanceDB call's process CPU time (``time.process_time``, every thread of this
process) to its kind: the vector query, a full-text query by column (``IN`` when restricted to a
list of documents), a take by row id, the full-text leg answered in memory (``TextIndex``, on tables
it fits; the server loads it at start-up, as this does). Run it on a copy of a table taken at the moment a server
slowed down to see what changed (issue 14: the writers' phase of ``bench_service.py``).

Reports CPU per search, per kind (ms per search and calls per search), and writes them to
``--out`` as JSON when given.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from concurrent.futures import Future
from pathlib import Path


class _Inline:
    """An executor that runs what is submitted at once, on the caller's thread (no overlap)."""

    def submit(self, fn, *args, **kwargs) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001 - handed to the caller through the future
            fut.set_exception(err)
        return fut


def _queries(path: str | None) -> list[str]:
    if path:
        return [q.strip() for q in Path(path).read_text(encoding="utf-8").splitlines() if q.strip()]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_service import WORDS

    rng = random.Random(14)  # bench_service.py's queries
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) for _ in range(200)]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--config", required=True, help="memory_pipeline.yaml of the memory to search")
    ap.add_argument("--queries", help="a file of queries, one per line")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long to search (after 20 warm-up searches)")
    ap.add_argument("--out", help="write the numbers here as JSON")
    args = ap.parse_args()

    from memory_pipeline.search import lanceaio
    from memory_pipeline.service.warm import WarmSearcher
    from memory_pipeline.settings import load_settings

    cpu: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()
    run = lanceaio.run

    def timed_run(table, queries):
        start = time.process_time()
        try:
            return run(table, queries)
        finally:
            first = queries[0]
            kind = type(first).__name__
            if kind == "TextQuery":
                kind = f"full text on {first.column}" + (" IN (documents)" if " IN (" in (first.where or "") else "")
            cpu[kind] += time.process_time() - start
            calls[kind] += 1

    lanceaio.run = timed_run  # the searcher and the full-text leg call it through the module

    import memory_pipeline.search.searcher as searcher_mod

    doc_leg = searcher_mod.doc_leg

    def timed_doc_leg(*a, **kw):  # the full-text leg answered in memory (``TextIndex``: tables it fits)
        start = time.process_time()
        try:
            return doc_leg(*a, **kw)
        finally:
            cpu["full text in memory (TextIndex)"] += time.process_time() - start
            calls["full text in memory (TextIndex)"] += 1

    searcher_mod.doc_leg = timed_doc_leg

    from memory_pipeline.errors import MemoryPipelineError

    try:
        warm = WarmSearcher(load_settings(args.config))
        queries = _queries(args.queries)
        if warm.get().table is None:
            raise MemoryPipelineError("this memory has no index yet: run `memory index` first")
    except (MemoryPipelineError, OSError) as err:
        print(f"[ERROR] {err}", file=sys.stderr)
        return 2
    if not queries:
        print("[ERROR] no queries to run", file=sys.stderr)
        return 2
    warm.warm()  # as the server does at start-up: the model, and the vectors and full-text statistics in memory where they fit

    timed: set[int] = set()  # providers whose query embedding is timed already (a new generation brings another)

    def one(query: str) -> None:
        searcher = warm.get()
        searcher._executor = _Inline  # pyright: ignore[reportAttributeAccessIssue] - the full-text leg on this thread
        provider = searcher.provider
        if provider is not None and id(provider) not in timed:
            embed = provider.embed_query

            def timed_embed(text, _embed=embed):
                start = time.process_time()
                try:
                    return _embed(text)
                finally:
                    cpu["query embedding"] += time.process_time() - start
                    calls["query embedding"] += 1

            provider.embed_query = timed_embed
            timed.add(id(provider))
        searcher.search(query, searcher.options())

    for q in queries[:20]:
        one(q)
    cpu.clear()
    calls.clear()
    start_cpu, start, n = time.process_time(), time.perf_counter(), 0
    while time.perf_counter() - start < args.seconds:
        one(queries[n % len(queries)])
        n += 1
    total = time.process_time() - start_cpu
    out = {
        "config": args.config,
        "searches": n,
        "cpu_ms_per_search": round(total * 1000 / n, 2),
        "wall_ms_per_search": round((time.perf_counter() - start) * 1000 / n, 2),
        "parts": {
            k: {"cpu_ms_per_search": round(v * 1000 / n, 2), "calls_per_search": round(calls[k] / n, 2)} for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])
        },
    }
    out["parts"]["the rest (Python: parsing, ranking, results)"] = {"cpu_ms_per_search": round((total - sum(cpu.values())) * 1000 / n, 2)}
    print(f"{n} searches: {out['cpu_ms_per_search']} ms of CPU each")
    for k, v in out["parts"].items():
        print(f"  {v['cpu_ms_per_search']:7.2f} ms  {k}" + (f"  ({v['calls_per_search']} per search)" if "calls_per_search" in v else ""))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
