"""Per-modality extraction throughput and peak RSS while indexing media.

    python benchmarks/bench_media.py [--images N] [--audio N] [--pdf-pages N] [--pad-mb M] [--out FILE]

Generates media with memory_pipeline_tests.sample_media (text images, espeak-ng speech,
text PDFs) in a temp folder, measures each extractor on its own (images/s of OCR,
audio seconds transcribed per wall second, PDF pages/s), then runs `memory index`
over all of it in a child process and reports that process's peak RSS. ``--pad-mb``
adds large photos (noise JPEGs, ~2 MB each) so memory can be compared as media grows.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memory_pipeline.discovery import sniff_file  # noqa: E402
from memory_pipeline.extraction import MediaOptions, extract  # noqa: E402
from memory_pipeline_tests import sample_media as sm  # noqa: E402

SENTENCES = [
    "The quarterly budget review moved to Thursday afternoon because the finance team is travelling.",
    "Remind me to renew the passport before the trip to Lisbon in February.",
    "We agreed to migrate the orders database to PostgreSQL sixteen during the next sprint.",
]


def make_media(root: Path, images: int, audio: int, pdf_pages: int, pad_mb: int) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    made = {"image": [], "audio": [], "pdf": [], "pad": []}
    for i in range(images):
        made["image"].append(sm.text_image(root / f"receipt-{i:03d}.jpg", [f"VENDOR {i}", f"Invoice {1000 + i}", f"TOTAL EUR {i * 3 + 7}.00"]))
    for i in range(audio):
        made["audio"].append(sm.speech_audio(root / f"voice-{i:03d}.mp3", SENTENCES[i % len(SENTENCES)]))
    made["pdf"].append(
        sm.text_pdf(root / "report.pdf", [[f"Page {p} of the report", f"Topic number {p} discussed at length"] for p in range(1, pdf_pages + 1)])
    )
    rng = np.random.default_rng(7)
    from PIL import Image

    for i in range(max(pad_mb // 2, 0)):
        arr = rng.integers(0, 255, size=(1100, 1100, 3), dtype=np.uint8)
        path = root / f"photo-{i:03d}.jpg"
        Image.fromarray(arr).save(path, quality=95)
        made["pad"].append(path)
    return made


def timed(paths, opts) -> tuple[float, list]:
    t = time.perf_counter()
    out = []
    for p in paths:
        mime, modality = sniff_file(str(p), p.name)
        out.append(extract(str(p), modality, mime, opts))
    return time.perf_counter() - t, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--audio", type=int, default=6)
    ap.add_argument("--pdf-pages", type=int, default=100)
    ap.add_argument("--pad-mb", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results-media.json"))
    args = ap.parse_args()
    opts = MediaOptions()
    with tempfile.TemporaryDirectory(prefix="bench-media-") as tmp:
        mem = Path(tmp) / "mem"
        made = make_media(mem / "media", args.images, args.audio, args.pdf_pages, args.pad_mb)
        # warm the Whisper model and tesseract once: start-up is reported apart
        t0 = time.perf_counter()
        timed(made["audio"][:1], opts)
        warm = time.perf_counter() - t0
        img_s, _ = timed(made["image"], opts)
        aud_s, segs = timed(made["audio"], opts)
        audio_seconds = sum(max((s.line_end for s in ss if s.kind == "time"), default=0) for ss in segs) / 1000
        pdf_s, _ = timed(made["pdf"], opts)
        total_bytes = sum(p.stat().st_size for ps in made.values() for p in ps)
        cfg = Path(tmp) / "memory_pipeline.yaml"
        cfg.write_text(f"data_dir: {tmp}/index\nsources: [{{name: mem, path: {mem}}}]\nprovider: local\n")
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "memory_pipeline.cli", "index", "--config", str(cfg), "--json"],
                              capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1"})  # fmt: skip
        index_s = time.perf_counter() - t
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            return 1
        summary = json.loads(proc.stdout)
        peak_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    result = {
        "media_files": sum(len(v) for v in made.values()),
        "media_mb": round(total_bytes / 1e6, 1),
        "whisper_and_first_clip_s": round(warm, 2),
        "images_per_s_ocr": round(len(made["image"]) / img_s, 2),
        "audio_seconds_per_wall_second": round(audio_seconds / aud_s, 2),
        "pdf_pages_per_s": round(args.pdf_pages / pdf_s, 1),
        "index_seconds": round(index_s, 1),
        "index_errors": len(summary["errors"]),
        "table_rows": summary["table_rows"],
        "peak_rss_mb_index_process": round(peak_rss_mb),
    }
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
