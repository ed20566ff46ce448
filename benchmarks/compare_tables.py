"""Index the shipped sample (media included) with two checkouts and compare the LanceDB tables.

    python benchmarks/compare_tables.py BEFORE_CHECKOUT AFTER_CHECKOUT [WORKDIR]

Each checkout needs a .venv (a link to this one is fine; `git worktree add` makes the
checkouts). Every column but indexed_at is compared, vectors rounded to 4 decimals and
paths taken relative to each run's folder. Prints one JSON line; exit 1 when they differ.
Used to show that a refactoring leaves the table unchanged.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lancedb


def build(repo: str, out: Path) -> list[dict]:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "sample", out / "mem")
    (out / "memory_pipeline.yaml").write_text("data_dir: index\nsources:\n  - name: mem\n    path: mem\nprovider: local\nmultimodal:\n  enabled: true\n")
    env = {**os.environ, "PYTHONPATH": repo, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [f"{repo}/.venv/bin/python", "-m", "memory_pipeline.cli", "index", "--config", str(out / "memory_pipeline.yaml"), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=repo,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    t = lancedb.connect(str(out / "index" / "lancedb")).open_table("memory_vectors").to_arrow()
    rows = t.drop(["indexed_at"]).to_pylist()
    for r_ in rows:
        r_["original_file_path"] = os.path.relpath(r_["original_file_path"], out)
        if r_.get("vector") is not None:
            r_["vector"] = [round(x, 4) for x in r_["vector"]]
    return sorted(rows, key=lambda r: r["chunk_id"])


before_repo, after_repo = sys.argv[1], sys.argv[2]
work = Path(sys.argv[3] if len(sys.argv) > 3 else "/tmp/compare-tables")
a = build(before_repo, work / "before")
b = build(after_repo, work / "after")
cols = sorted(set(a[0]) | set(b[0]))
same = a == b
print(json.dumps({"rows_before": len(a), "rows_after": len(b), "identical": same, "columns": len(cols)}))
if not same:
    for x, y in zip(a, b):
        if x != y:
            print({k: (str(x.get(k))[:200], str(y.get(k))[:200]) for k in cols if x.get(k) != y.get(k)})
            break
    sys.exit(1)
