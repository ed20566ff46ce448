"""`memory eval`: retrieval quality on a corpus in the BEIR format.

Input (BEIR): ``corpus.jsonl`` lines ``{"_id", "title", "text"}``, ``queries.jsonl`` lines
``{"_id", "text"}``, and a qrels TSV with a header line and rows ``query-id corpus-id score``
(score > 0 is relevant; larger is more relevant, used as the nDCG gain).

The corpus is indexed by the real pipeline (the configured provider, chunking, cache
rules, FTS and ANN settings) into a temporary data folder: each document becomes one
file, so long documents are chunked exactly as notes are, and a document is scored by
its best chunk. Every query of the qrels is run in each mode asked for:

* ``hybrid``, ``vector``, ``fts``: this project's search (fusion and weights from the
  config; ``min_score`` 0, MMR and recency off: eval measures ranking, not presentation);
* ``lancedb-rrf``: the baseline, plain LanceDB hybrid search on whole documents (one row
  and one vector per document, the same model; LanceDB's default FTS index and its
  ``RRFReranker``).

Metrics (the usual definitions, as in pytrec_eval / BEIR): nDCG@10 with linear gain
``rel / log2(rank + 1)`` over the ideal ordering of the judged documents, Recall@k = found
relevant / all relevant, MRR@10 = 1 / rank of the first relevant document in the top 10
(0 if none), averaged over the queries that have at least one relevant document in the
qrels. Latency is the wall time of each query, including embedding it, in a warm process.

Abstention (this project's modes; ``lancedb-rrf`` has no such rule and reports none): each query
is run a second time as the product runs it, with the config's ``min_score`` and the standout rule
of ``search.scoring`` at the product's own pool (``max_results`` x ``candidate_multiplier``). This
pass is separate from the ranking above, which stays at ``min_score`` 0, so nDCG is unaffected.
``answerable_abstain`` is the share of the judged queries (at least one relevant document) for which
that search returns nothing; ``no_answer_answer`` the share of the queries without qrels (the
labelled set marks them ``"metadata": {"kind": "no-answer"}``) for which it returns anything,
``null`` when the queries file has none.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from memory_pipeline.errors import ConfigError, StoreError
from memory_pipeline.settings import Settings, load_settings

EVAL_MODES = ("hybrid", "vector", "fts", "lancedb-rrf")
DEPTH = 100  # documents ranked per query (Recall@100)
_SOURCE = "eval"


@dataclass(frozen=True)
class BeirSet:
    corpus: dict[str, tuple[str, str]]  # id -> (title, text)
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]  # query id -> {doc id: relevance}


BEIR_HINT = 'fix the file: BEIR format is corpus.jsonl and queries.jsonl ({"_id", "text"} per line) and qrels.tsv (query-id, corpus-id, score)'


def _bad(path: str | Path, what: str, message: str) -> ConfigError:
    return ConfigError(f"{path}: {message}", key=what, path=str(path), hint=BEIR_HINT)


def _jsonl(path: str | Path, what: str, fields: Sequence[str]) -> list[dict]:
    """The lines of a BEIR JSONL file; ``_id`` unique, ``text`` (and ``title``) strings or null.

    A repeated ``_id`` was kept once, silently (three lines read as two documents), and a ``text``
    of another type was turned into its string (``5``, ``null`` as "None"): each is now an error
    naming its line."""
    rows = []
    seen: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise _bad(path, what, f"line {n} is not JSON ({err.msg})") from err
                if not isinstance(row, dict) or any(f not in row for f in fields):
                    raise _bad(path, what, f"line {n} lacks {', '.join(fields)} ({what} in BEIR format)")
                for name in ("text", "title"):
                    if row.get(name) is not None and not isinstance(row[name], str):
                        raise _bad(path, what, f"line {n}: {name} is {type(row[name]).__name__}, not a string")
                if not isinstance(row["_id"], (str, int)) or isinstance(row["_id"], bool):
                    raise _bad(path, what, f"line {n}: _id is {type(row['_id']).__name__}, not a string")
                key = str(row["_id"])
                if key in seen:
                    raise _bad(path, what, f"line {n}: _id {key!r} is already on line {seen[key]}")
                seen[key] = n
                rows.append(row)
    except UnicodeDecodeError as err:
        raise _bad(path, what, "not UTF-8 text") from err
    except OSError as err:
        raise _bad(path, what, f"cannot read ({err.strerror or err})") from err
    return rows


def load_beir(corpus: str | Path, queries: str | Path, qrels: str | Path) -> BeirSet:
    """Read and check the three files; ids of qrels must exist in the corpus and the queries."""
    docs: dict[str, tuple[str, str]] = {}
    for row in _jsonl(corpus, "corpus", ("_id", "text")):
        docs[str(row["_id"])] = (str(row.get("title") or ""), str(row["text"] or ""))
    qs = {str(r["_id"]): str(r["text"] or "") for r in _jsonl(queries, "queries", ("_id", "text"))}
    judged: dict[str, dict[str, int]] = {}
    try:
        lines = Path(qrels).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise _bad(qrels, "qrels", f"cannot read as UTF-8 text ({err})") from err
    for n, line in enumerate(lines, start=1):
        parts = line.split("\t") if "\t" in line else line.split()
        if not line.strip() or (n == 1 and not _is_int(parts[-1])):
            continue  # the header (query-id corpus-id score)
        if len(parts) != 3 or not _is_int(parts[2]):
            raise _bad(qrels, "qrels", f"line {n} must be 'query-id<TAB>corpus-id<TAB>score'")
        qid, did, score = parts[0].strip(), parts[1].strip(), int(parts[2])
        if did not in docs:
            raise _bad(qrels, "qrels", f"line {n}: corpus id {did!r} is not in the corpus")
        if qid not in qs:
            raise _bad(qrels, "qrels", f"line {n}: query id {qid!r} is not in the queries")
        judged.setdefault(qid, {})[did] = score
    if not docs:
        raise _bad(corpus, "corpus", "no documents")
    if not any(score > 0 for rels in judged.values() for score in rels.values()):
        # Nothing to measure: every metric would print 0.0000 for "0 judged queries", with exit 0.
        raise _bad(qrels, "qrels", "no query has a relevant document (a score above 0): there is nothing to measure")
    return BeirSet(docs, qs, judged)


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


# --- metrics ------------------------------------------------------------------------------


def ndcg_at_k(ranking: Sequence[str], rels: dict[str, int], k: int = 10) -> float:
    dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:k]) if rels.get(d, 0) > 0)
    ideal = sorted((r for r in rels.values() if r > 0), reverse=True)[:k]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at_k(ranking: Sequence[str], rels: dict[str, int], k: int) -> float:
    relevant = {d for d, r in rels.items() if r > 0}
    return len(relevant & set(ranking[:k])) / len(relevant) if relevant else 0.0


def mrr_at_k(ranking: Sequence[str], rels: dict[str, int], k: int = 10) -> float:
    for i, d in enumerate(ranking[:k], start=1):
        if rels.get(d, 0) > 0:
            return 1.0 / i
    return 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), 0 for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else 0.0


def score_rankings(rankings: dict[str, list[str]], qrels: dict[str, dict[str, int]], latencies_ms: Sequence[float] = ()) -> dict:
    """The mean metrics over every query with a relevant document (a query never ranked counts 0)."""
    judged = [q for q, rels in qrels.items() if any(r > 0 for r in rels.values())]
    out = {"ndcg@10": 0.0, "recall@10": 0.0, "recall@100": 0.0, "mrr@10": 0.0}
    for q in judged:
        ranking, rels = rankings.get(q, []), qrels[q]
        out["ndcg@10"] += ndcg_at_k(ranking, rels, 10)
        out["recall@10"] += recall_at_k(ranking, rels, 10)
        out["recall@100"] += recall_at_k(ranking, rels, 100)
        out["mrr@10"] += mrr_at_k(ranking, rels, 10)
    n = max(len(judged), 1)
    out = {k: round(v / n, 4) for k, v in out.items()}
    out["queries"] = len(judged)
    out["latency_ms_p50"] = round(percentile(latencies_ms, 50), 2)
    out["latency_ms_p95"] = round(percentile(latencies_ms, 95), 2)
    return out


# --- indexing the corpus ------------------------------------------------------------------


def _eval_config(settings: Settings, workdir: Path) -> Path:
    """A config for the temporary index: the user's provider, model, local runtime, chunking and search knobs."""
    cfg = {
        "data_dir": str(workdir / "index"),
        "sources": [{"name": _SOURCE, "path": str(workdir / "docs"), "include": ["**/*.txt"]}],
        "provider": settings.provider,
        "local": asdict(settings.local),
        "chunking": asdict(settings.chunking),
        "cache": asdict(settings.cache),
        "query": asdict(settings.query),
        "limits": asdict(settings.limits),
        "ann": asdict(settings.ann),
        "fts": asdict(settings.fts),
        "checks": {"min_coverage": 0.0},
    }
    if settings.model:
        cfg["model"] = settings.model
    path = workdir / "memory_pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False))
    return path


_DOC_FILE = re.compile(r"d\d{7}\.txt")


def _doc_file(i: int) -> str:
    # A neutral name: the file name is indexed for full-text search, the corpus id must not be.
    return f"d{i:07d}.txt"


def index_corpus(settings: Settings, beir: BeirSet, workdir: Path) -> tuple[Settings, dict[str, str], Mapping[str, Any]]:
    """Write one file per document and run the real index over them; returns
    (the eval settings, file path -> corpus id, the index summary)."""
    from memory_pipeline.runner import run_index

    docs_dir = workdir / "docs"
    docs_dir.mkdir(parents=True, exist_ok=True)
    path_to_id: dict[str, str] = {}
    for i, (doc_id, (title, text)) in enumerate(sorted(beir.corpus.items())):
        name = _doc_file(i)
        path_to_id[name] = doc_id
        body = f"{title}\n\n{text}" if title else text
        target = docs_dir / name
        if not target.is_file() or target.read_text(encoding="utf-8") != body + "\n":
            target.write_text(body + "\n", encoding="utf-8")
    # A kept folder of a larger corpus: its extra documents would be indexed and ranked too. Only
    # files this function names are removed (a --keep folder may hold anything else).
    for stale in docs_dir.glob("d*.txt"):
        if stale.name not in path_to_id and _DOC_FILE.fullmatch(stale.name) and stale.is_file():
            stale.unlink()
    eval_settings = load_settings(_eval_config(settings, workdir))
    summary = run_index(eval_settings)
    return eval_settings, path_to_id, summary


# --- running the queries ------------------------------------------------------------------


def _rank_docs(searcher, query: str, opts, path_to_id: dict[str, str]) -> list[str]:
    """Documents best first, each scored by its best chunk."""
    ranking: list[str] = []
    seen: set[str] = set()
    # Light: ranking reads the candidates' paths, never their text (as a search of DEPTH results would take).
    for cand in searcher.ranked(query, opts, pool=DEPTH * searcher.settings.query.candidate_multiplier, light=True):
        doc = path_to_id.get(cand.row["path"])
        if doc is not None and doc not in seen:
            seen.add(doc)
            ranking.append(doc)
            if len(ranking) == DEPTH:
                break
    return ranking


def _run_ours(eval_settings: Settings, beir: BeirSet, path_to_id: dict[str, str], mode: str) -> dict:
    from memory_pipeline.search import MemorySearcher

    searcher = MemorySearcher(eval_settings)
    opts = searcher.options(max_results=DEPTH, min_score=0.0, mode=mode, mmr=False, recency_half_life_days=0.0)
    qids = sorted(beir.qrels)
    if qids:
        _rank_docs(searcher, beir.queries[qids[0]], opts, path_to_id)  # warm-up: model and table loaded
        searcher.warm()  # and what a long-lived searcher holds in memory (as ``memory serve`` at start-up)
    rankings, lat = {}, []
    for q in qids:
        t0 = time.perf_counter()
        rankings[q] = _rank_docs(searcher, beir.queries[q], opts, path_to_id)
        lat.append((time.perf_counter() - t0) * 1000)
    out = score_rankings(rankings, beir.qrels, lat)
    out["abstention"] = _abstention(searcher, beir, mode)
    return out


def answerable_queries(qrels: dict[str, dict[str, int]]) -> list[str]:
    """The judged queries: at least one relevant document (those nDCG averages over)."""
    return sorted(q for q, rels in qrels.items() if any(r > 0 for r in rels.values()))


def no_answer_queries(beir: BeirSet) -> list[str]:
    """The queries without qrels: nothing in the corpus answers them (the labelled set's ``no-answer`` kind)."""
    return sorted(set(beir.queries) - set(beir.qrels))


def _abstention(searcher, beir: BeirSet, mode: str) -> dict:
    """Each query run as the product runs it (the config's ``min_score``, the standout rule, the
    default pool): answerable queries that return nothing, no-answer queries that return anything."""
    from memory_pipeline.search.scoring import STANDOUT_FLOOR, STANDOUT_Z

    opts = searcher.options(mode=mode)
    answerable, no_answer = answerable_queries(beir.qrels), no_answer_queries(beir)
    abstained = sum(1 for q in answerable if not searcher.ranked(beir.queries[q], opts))
    answered = sum(1 for q in no_answer if searcher.ranked(beir.queries[q], opts))
    return {
        "min_score": opts.min_score,
        "standout_z": STANDOUT_Z,
        "standout_floor": STANDOUT_FLOOR,
        "answerable": len(answerable),
        "answerable_abstained": abstained,
        "answerable_abstain": round(abstained / len(answerable), 4) if answerable else None,
        "no_answer": len(no_answer),
        "no_answer_answered": answered,
        "no_answer_answer": round(answered / len(no_answer), 4) if no_answer else None,
    }


def _run_lancedb_rrf(eval_settings: Settings, beir: BeirSet, workdir: Path) -> dict:
    """Plain LanceDB hybrid: whole documents, one vector each, default FTS, RRF reranker."""
    import lancedb
    import pyarrow as pa
    from lancedb.rerankers import RRFReranker

    from memory_pipeline.providers.registry import resolve_provider

    provider = resolve_provider(eval_settings).provider
    if provider is None:
        raise ConfigError("mode lancedb-rrf needs an embedding provider (it is vector + full-text)", key="mode")
    ids = sorted(beir.corpus)
    texts = [f"{beir.corpus[i][0]}\n\n{beir.corpus[i][1]}".strip() for i in ids]
    db = lancedb.connect(str(workdir / "baseline"))
    # A kept folder reuses the baseline table built from the same documents and model.
    digest = hashlib.sha256(json.dumps([eval_settings.provider, eval_settings.model, provider.provider_key, ids, texts]).encode()).hexdigest()
    stamp = workdir / "baseline" / "whole_docs.sha256"
    table = None
    if stamp.is_file() and stamp.read_text().strip() == digest:
        try:
            table = db.open_table("whole_docs")
        except (ValueError, FileNotFoundError):
            table = None
    if table is None:
        vecs = np.concatenate([provider.embed_documents(texts[i : i + 256]) for i in range(0, len(texts), 256)]).astype(np.float32)
        data = pa.table(
            {
                "doc_id": ids,
                "text": texts,
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), type=pa.float32()), vecs.shape[1]),
            }
        )
        table = db.create_table("whole_docs", data=data, mode="overwrite")
        table.create_fts_index("text", replace=True)
        stamp.write_text(digest + "\n")
    reranker = RRFReranker()

    def rank(query: str) -> list[str]:
        qvec = provider.embed_query(query)
        q = table.search(query_type="hybrid").vector(qvec).text(query).rerank(reranker).limit(DEPTH)
        return q.select(["doc_id"]).to_arrow().column("doc_id").to_pylist()

    qids = sorted(beir.qrels)
    if qids:
        rank(beir.queries[qids[0]])
    rankings, lat = {}, []
    for q in qids:
        t0 = time.perf_counter()
        rankings[q] = rank(beir.queries[q])
        lat.append((time.perf_counter() - t0) * 1000)
    out = score_rankings(rankings, beir.qrels, lat)
    out["abstention"] = None  # plain LanceDB has no min_score or standout rule: it always answers
    return out


def run_eval(
    settings: Settings,
    corpus: str | Path,
    queries: str | Path,
    qrels: str | Path,
    *,
    modes: Sequence[str] = ("hybrid", "vector", "fts"),
    keep_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Index the corpus into a temporary folder and report the metrics of each mode."""
    for m in modes:
        if m not in EVAL_MODES:
            raise ConfigError(f"eval mode must be one of {', '.join(EVAL_MODES)}, got {m!r}", key="mode")
    beir = load_beir(corpus, queries, qrels)
    workdir = Path(keep_dir).resolve() if keep_dir else Path(tempfile.mkdtemp(prefix="memory-eval-"))
    workdir.mkdir(parents=True, exist_ok=True)
    say = log or (lambda _msg: None)
    try:
        say(f"indexing {len(beir.corpus)} documents into {workdir} …")
        started = time.perf_counter()
        eval_settings, path_to_id, summary = index_corpus(settings, beir, workdir)
        if not summary.get("table_rows") and any(t.strip() or x.strip() for t, x in beir.corpus.values()):
            # Every metric would be 0: say why instead of reporting it as a result.
            first = (summary.get("errors") or [{}])[0]
            raise StoreError(
                f"none of the corpus's {len(beir.corpus)} documents was indexed" + (f" (first error: {first.get('error') or first})" if first else "")
            )
        report = {
            "corpus": str(corpus),
            "documents": len(beir.corpus),
            "chunks": summary.get("table_rows", 0),
            "queries": sum(1 for rels in beir.qrels.values() if any(r > 0 for r in rels.values())),
            "queries_without_judgements": len(set(beir.queries) - set(beir.qrels)),
            "provider": summary.get("provider"),
            "model": summary.get("model"),
            "fusion": eval_settings.query.fusion,
            "index_seconds": round(time.perf_counter() - started, 1),
            "index_errors": [{**e, "path": path_to_id.get(Path(e.get("path", "")).name, e.get("path"))} for e in summary.get("errors", [])],
            "modes": {},
        }
        for mode in modes:
            say(f"running {report['queries']} queries in mode {mode} …")
            if mode == "lancedb-rrf":
                report["modes"][mode] = _run_lancedb_rrf(eval_settings, beir, workdir)
            else:
                report["modes"][mode] = _run_ours(eval_settings, beir, path_to_id, mode)
        return report
    finally:
        if not keep_dir:
            shutil.rmtree(workdir, ignore_errors=True)


def format_report(report: dict) -> str:
    lines = [
        f"corpus {report['corpus']}: {report['documents']} documents, {report['chunks']} chunks, "
        f"{report['queries']} judged queries; {report['provider']}/{report['model']}, fusion {report['fusion']}",
        f"{'mode':<12} {'nDCG@10':>8} {'R@10':>7} {'R@100':>7} {'MRR@10':>7} {'p50 ms':>8} {'p95 ms':>8} {'abstain':>8} {'no-ans':>7}",
    ]
    rule = None
    for mode, m in report["modes"].items():
        ab = m.get("abstention")
        rule = rule or ab
        lines.append(
            f"{mode:<12} {m['ndcg@10']:>8.4f} {m['recall@10']:>7.4f} {m['recall@100']:>7.4f} {m['mrr@10']:>7.4f} "
            f"{m['latency_ms_p50']:>8.1f} {m['latency_ms_p95']:>8.1f} {_share(ab and ab['answerable_abstain']):>8} {_share(ab and ab['no_answer_answer']):>7}"
        )
    if rule:
        lines.append(
            f"abstain: judged queries that return nothing, no-ans: the {rule['no_answer']} queries without qrels that return "
            f"something; the product's search at min_score {rule['min_score']:g} / standout {rule['standout_z']:g} sigma"
        )
    if report["index_errors"]:
        lines.append(f"{len(report['index_errors'])} documents could not be indexed (see --json)")
    return "\n".join(lines)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
