#!/usr/bin/env python
"""Abstention trade-off: how often answerable queries return nothing and no-answer queries answer,
for several ``min_score`` / standout rules, on the development sets (issue 13).

    .venv/bin/python benchmarks/abstention.py --work /tmp/abstention [--scifact] [--out FILE]

Each set is indexed with ``memory eval``'s own code (``evaluation.index_corpus``, the default
config: local model, default chunking) into ``--work/<set>`` (kept: a second run re-uses the
index), then every query runs once as the product runs it (hybrid, default fusion, the default
pool ``max_results`` x ``candidate_multiplier``) with ``min_score`` 0, and the candidates'
relevances are kept. Each rule is then applied to those relevances (``scoring.abstain``'s own
``standout``), so all rules are compared on exactly the same candidates.

* answerable: every judged query of LoCoMo conv-26 and conv-30 (``../shared/eval-dev``) and of
  the labelled set ``data/eval/agent-memory``; with ``--scifact`` also SciFact train's 809
  claims (5,183 abstracts to embed: minutes), reported apart;
* no-answer: the labelled set's queries without qrels and, as hard near-misses, conv-26's
  questions (about Caroline and Melanie) asked of conv-30 (two other people, same chat style).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from memory_pipeline.evaluation import answerable_queries, index_corpus, load_beir, no_answer_queries  # noqa: E402
from memory_pipeline.search import MemorySearcher  # noqa: E402
from memory_pipeline.search.scoring import STANDOUT_Z, Candidate, abstain  # noqa: E402
from memory_pipeline.settings import load_settings  # noqa: E402

RULES = [(0.45, 6.0), (0.5, 8.0), (0.5, 10.0), (0.5, 12.0), (0.5, None), (0.55, 8.0)]


def _qrels(folder: Path) -> Path:
    return folder / "qrels.tsv" if (folder / "qrels.tsv").is_file() else folder / "qrels" / "test.tsv"


def relevances(work: Path, folder: Path, extra_queries: Path | None = None) -> dict[str, dict[str, list[float]]]:
    """Per query, every candidate's relevance: {"answerable": …, "no_answer": …, "extra": …}."""
    beir = load_beir(folder / "corpus.jsonl", folder / "queries.jsonl", _qrels(folder))
    config = work / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("data_dir: unused\nsources:\n  - name: x\n    path: .\nprovider: local\n", encoding="utf-8")
    settings, _, _ = index_corpus(load_settings(str(config)), beir, work)
    searcher = MemorySearcher(settings)
    opts = searcher.options(mode="hybrid", min_score=0.0)

    def rel(text: str) -> list[float]:
        return [c.relevance for c in searcher.ranked(text, opts)]

    out = {
        "answerable": {q: rel(beir.queries[q]) for q in answerable_queries(beir.qrels)},
        "no_answer": {q: rel(beir.queries[q]) for q in no_answer_queries(beir)},
        "extra": {},
    }
    if extra_queries is not None:
        for line in extra_queries.read_text(encoding="utf-8").splitlines():
            if line.strip():
                q = json.loads(line)
                out["extra"][q["_id"]] = rel(q["text"])
    return out


def answers(rels: list[float], min_score: float, z: float | None) -> bool:
    """Whether the rule returns anything: the product's own ``scoring.abstain`` with these knobs."""
    return bool(abstain([Candidate(row={}, relevance=r) for r in rels], min_score, standout_z=z))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, help="where the sets are indexed (kept and re-used)")
    ap.add_argument("--dev", default=str(REPO.parent / "shared" / "eval-dev"))
    ap.add_argument("--scifact", action="store_true", help="also SciFact train (embeds 5,183 abstracts)")
    ap.add_argument("--out", default=None, help="write the rates as JSON here")
    args = ap.parse_args()
    work, dev = Path(args.work), Path(args.dev)
    sets = {
        "conv-26": relevances(work / "conv-26", dev / "locomo-dev" / "conv-26"),
        "conv-30": relevances(work / "conv-30", dev / "locomo-dev" / "conv-30", dev / "locomo-dev" / "conv-26" / "queries.jsonl"),
        "labelled": relevances(work / "labelled", REPO / "data" / "eval" / "agent-memory"),
    }
    if args.scifact:
        sets["scifact-train"] = relevances(work / "scifact-train", dev / "scifact-train")
    rows = []
    for min_score, z in RULES:
        abstain = {name: sum(not answers(r, min_score, z) for r in s["answerable"].values()) for name, s in sets.items()}
        asked = {name: len(s["answerable"]) for name, s in sets.items()}
        main_sets = ("conv-26", "conv-30", "labelled")
        lab_na = sum(answers(r, min_score, z) for r in sets["labelled"]["no_answer"].values())
        cross = sum(answers(r, min_score, z) for r in sets["conv-30"]["extra"].values())
        n_lab, n_cross = len(sets["labelled"]["no_answer"]), len(sets["conv-30"]["extra"])
        rows.append(
            {
                "min_score": min_score,
                "standout_z": z,
                "default": (min_score, z) == (0.5, STANDOUT_Z),
                "answerable_abstain": round(sum(abstain[n] for n in main_sets) / sum(asked[n] for n in main_sets), 4),
                "per_set_abstain": {n: round(abstain[n] / asked[n], 4) for n in sets},
                "labelled_no_answer_answered": f"{lab_na} of {n_lab}",
                "cross_conversation_answer": round(cross / n_cross, 4),
                "no_answer_answer": round((lab_na + cross) / (n_lab + n_cross), 4),
            }
        )
    for r in rows:
        z = "off" if r["standout_z"] is None else f"{r['standout_z']:g} sigma"
        mark = " (default)" if r["default"] else ""
        print(
            f"{r['min_score']} / {z}{mark}: answerable abstain {r['answerable_abstain']:.1%} {r['per_set_abstain']}; "
            f"labelled no-answer {r['labelled_no_answer_answered']}, cross-conversation {r['cross_conversation_answer']:.1%}, "
            f"all no-answer {r['no_answer_answer']:.1%}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
