"""Redaction cost and reach: CPU seconds per MB of `redact` over BEIR-style corpora, and, with
``--against REV``, how many texts the redaction of another git revision leaves differently.

    .venv/bin/python benchmarks/bench_redact.py ../shared/eval-dev/*/corpus.jsonl ../shared/eval-dev/*/*/corpus.jsonl \
        --against HEAD~1 --out benchmarks/results-redact.json

Each corpus line is a JSON object; its ``title`` and ``text`` are redacted as one text (as
`memory eval` indexes them). Both versions run in this process, one after the other, three
rounds each; the fastest round of each is reported (a shared machine only ever adds time).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROUNDS = 3


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _texts(path: Path) -> list[str]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            doc = json.loads(line)
            out.append(f"{doc.get('title') or ''}\n{doc.get('text') or ''}")
    return out


def _timed(redact, texts: list[str]) -> tuple[float, list[str]]:
    best, done = float("inf"), []
    for _ in range(ROUNDS):
        start = time.process_time()
        done = [redact(t)[0] for t in texts]
        best = min(best, time.process_time() - start)
    return best, done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("corpora", nargs="+", type=Path)
    ap.add_argument("--against", help="a git revision whose memory_pipeline/extraction/redact.py is compared")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results-redact.json")
    args = ap.parse_args(argv)
    versions = {"current": _load("redact_current", REPO / "memory_pipeline" / "extraction" / "redact.py")}
    if args.against:
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{args.against}:memory_pipeline/extraction/redact.py"], capture_output=True, text=True, check=True
        ).stdout
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(source)
        versions["against"] = _load("redact_against", Path(f.name))
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    results: dict = {"commit": commit, "against": args.against, "rounds": ROUNDS, "corpora": {}}
    for corpus in args.corpora:
        texts = _texts(corpus)
        mb = sum(len(t.encode()) for t in texts) / 1e6
        row: dict = {"texts": len(texts), "mb": round(mb, 2)}
        outputs = {}
        for name, module in versions.items():
            seconds, outputs[name] = _timed(module.redact, texts)
            row[f"{name}_cpu_s_per_mb"] = round(seconds / mb, 4) if mb else 0.0
        if "against" in outputs:
            row["texts_redacted_differently"] = sum(a != b for a, b in zip(outputs["current"], outputs["against"], strict=True))
        results["corpora"][str(corpus)] = row
        print(corpus, json.dumps(row))
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
