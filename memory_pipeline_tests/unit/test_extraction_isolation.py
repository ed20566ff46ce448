"""Media and document extraction is bounded: zip bombs refused, a hanging or ballooning extractor killed,
the worker restarted for the next file, never outliving its parent, never started by a text-only run.

The hooks below (``hang``, ``balloon``…) are passed to ``extract(extractor=...)``: they run inside the
worker process in place of the real extractor, which imports them from this module by name.
"""

from __future__ import annotations

import io
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import psutil
import pytest

from memory_pipeline.discovery import DOCX_MIME, sniff_file
from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction import ExtractionWorker, MediaOptions, extract
from memory_pipeline.extraction.media import HARD_LIMIT_GRACE_SECONDS

HTML = "<!doctype html><html><head><title>Runbook</title></head><body><p>Restart the router first.</p></body></html>"


# --- hooks run inside the worker ------------------------------------------------------------


def hang(src, mime, options):
    """Spins holding the GIL, as a decoder stuck in C code would: no deadline check is ever reached."""
    while True:
        pass


def balloon(src, mime, options):
    """Allocates 16 MB every few milliseconds, like the 1.2 MB docx that reached 5.5 GB."""
    hold = []
    while True:
        hold.append(b"x" * (16 << 20))
        time.sleep(0.005)


def huge(src, mime, options):
    """One 8 GB allocation: faster than any poll, stopped by RLIMIT_DATA instead."""
    return [b"x" * (8 << 30)]


def crash(src, mime, options):
    os.kill(os.getpid(), signal.SIGSEGV)


def spawn_and_hang(src, mime, options):
    """Starts a tool (as ffmpeg or tesseract would be) and hangs; the pid goes where the file says."""
    child = subprocess.Popen(["sleep", "1000"])
    Path(src.pread(1000).decode().strip()).write_text(str(child.pid))
    while True:
        time.sleep(0.1)


def peak_rss_mb(pid: int) -> float:
    """The high-water mark of a process's resident memory (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def worker():
    w = ExtractionWorker()
    yield w
    w.close()


@pytest.fixture
def html_file(tmp_path) -> Path:
    p = tmp_path / "runbook.html"
    p.write_text(HTML)
    return p


def docx_bomb(path: Path, paragraphs: int = 1_100_000) -> Path:
    """A ~170 KB .docx whose word/document.xml inflates to ~41 MB: 1.1 million tiny paragraphs."""
    import random

    rnd = random.Random(11)
    words = ["alpha", "beta", "gamma", "delta", "omega", "kappa"]
    run = "".join(f"<w:p><w:r><w:t>{words[i % 6]}</w:t></w:r></w:p>" for i in range(399))
    parts = []
    for _ in range(paragraphs // 400):
        parts.append(run)
        parts.append(f"<w:p><w:r><w:t>{rnd.choice(words)}{rnd.randrange(10**6)}</w:t></w:r></w:p>")
    xml = (
        "<?xml version='1.0' encoding='UTF-8' standalone='yes'?>"
        "<w:document xmlns:w='http://schemas.openxmlformats.org/wordprocessingml/2006/main'><w:body>" + "".join(parts) + "</w:body></w:document>"
    ).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        zf.writestr("[Content_Types].xml", "<Types xmlns='http://schemas.openxmlformats.org/package/2006/content-types'/>")
        zf.writestr("word/document.xml", xml)
    path.write_bytes(out.getvalue())
    return path


# --- zip bombs ----------------------------------------------------------------------------------


def test_docx_zip_bomb_fails_fast_with_a_reason(tmp_path, worker):
    """The bomb that took 251 s, 865 MB and gave 1,100,001 segments is refused in well under a second."""
    bomb = docx_bomb(tmp_path / "bomb.docx")
    assert 100_000 < bomb.stat().st_size < 250_000
    with zipfile.ZipFile(bomb) as zf:
        assert zf.getinfo("word/document.xml").file_size >= 40_000_000
    assert sniff_file(str(bomb), "bomb.docx") == (DOCX_MIME, "document")
    t = time.monotonic()
    with pytest.raises(ExtractionError, match=r"word/document.xml would expand \d+x .*max_zip_ratio=100 \(a zip bomb\?\)"):
        extract(str(bomb), "document", DOCX_MIME, MediaOptions(), worker=worker)
    assert time.monotonic() - t < 5
    assert peak_rss_mb(worker.pid) < 200


def test_docx_over_the_total_size_cap_is_refused(tmp_path, worker):
    bomb = docx_bomb(tmp_path / "bomb.docx", paragraphs=200_000)
    with pytest.raises(ExtractionError, match="would expand to .* over max_unzipped_bytes=1000000"):
        extract(str(bomb), "document", DOCX_MIME, MediaOptions(max_unzipped_bytes=1_000_000, max_zip_ratio=1e9), worker=worker)


def test_docx_let_through_is_streamed_in_flat_memory_and_capped(tmp_path, worker):
    """With the ratio check waived, the 41 MB XML is parsed as a stream and stops at max_segments."""
    bomb = docx_bomb(tmp_path / "bomb.docx")
    t = time.monotonic()
    segments = extract(str(bomb), "document", DOCX_MIME, MediaOptions(max_zip_ratio=1e9, max_segments=20_000), worker=worker)
    assert time.monotonic() - t < 20
    assert len(segments) == 19_999  # the description and 19,998 paragraphs: room kept for a note
    assert segments.warning == "indexed the first 19998 paragraphs and rows (max_segments=20000)"
    assert [s.text for s in segments[1:4]] == ["alpha", "beta", "gamma"]
    assert peak_rss_mb(worker.pid) < 250


def _lie_about_size(data: bytes, name: bytes, size: int) -> bytes:
    """The zip with ``name``'s uncompressed size rewritten in both headers (what the central directory claims)."""
    out = bytearray(data)
    local = out.find(b"PK\x03\x04")
    while local != -1:
        if out[local + 30 : local + 30 + len(name)] == name:
            struct.pack_into("<I", out, local + 22, size)
        local = out.find(b"PK\x03\x04", local + 4)
    central = out.find(b"PK\x01\x02")
    while central != -1:
        if out[central + 46 : central + 46 + len(name)] == name:
            struct.pack_into("<I", out, central + 24, size)
        central = out.find(b"PK\x01\x02", central + 4)
    return bytes(out)


def test_docx_whose_headers_lie_is_read_only_as_far_as_they_say(tmp_path, worker):
    """A bomb claiming 2 KB passes the directory check; inflation still stops at 2 KB: a corrupt file, fast."""
    bomb = docx_bomb(tmp_path / "bomb.docx")
    liar = tmp_path / "liar.docx"
    liar.write_bytes(_lie_about_size(bomb.read_bytes(), b"word/document.xml", 2000))
    with zipfile.ZipFile(liar) as zf:
        assert zf.getinfo("word/document.xml").file_size == 2000
    t = time.monotonic()
    with pytest.raises(ExtractionError, match="Word document is corrupt"):
        extract(str(liar), "document", DOCX_MIME, MediaOptions(), worker=worker)
    assert time.monotonic() - t < 5
    assert peak_rss_mb(worker.pid) < 200


@pytest.mark.parametrize(
    "doctype",
    [
        '<!DOCTYPE w [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>',
        '<!DOCTYPE w [<!ENTITY x SYSTEM "file:///etc/passwd">]>',
    ],
    ids=["billion laughs", "external entity"],
)
def test_entities_are_refused_in_docx_and_xml(tmp_path, worker, doctype):
    body = f"<?xml version='1.0'?>{doctype}<w:document xmlns:w='http://schemas.openxmlformats.org/wordprocessingml/2006/main'><w:body><w:p><w:r><w:t>&b;</w:t></w:r></w:p></w:body></w:document>"
    docx = tmp_path / "e.docx"
    with zipfile.ZipFile(docx, "w") as zf:
        zf.writestr("word/document.xml", body)
    with pytest.raises(ExtractionError, match="DTD or entities"):
        extract(str(docx), "document", DOCX_MIME, worker=worker)
    xml = tmp_path / "e.xml"
    xml.write_text(f"<?xml version='1.0'?>{doctype}<feed><t>&b;</t></feed>")
    with pytest.raises(ExtractionError, match="entities or external references"):
        extract(str(xml), "document", "application/xml", worker=worker)


# --- the worker: deadline, memory ceiling, crash, restart -----------------------------------------------


def test_hanging_extractor_is_killed_at_its_deadline_and_the_worker_restarts(html_file, worker):
    extract(str(html_file), "document", "text/html", worker=worker)
    first = worker.pid
    t = time.monotonic()
    with pytest.raises(ExtractionError, match=r"extraction took longer than 1.5 s \(max_extract_seconds\)"):
        extract(str(html_file), "document", "text/html", MediaOptions(max_extract_seconds=1.5), worker=worker, extractor=hang)
    assert 1.5 <= time.monotonic() - t < 4
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    # The next file gets a fresh worker and extracts as usual.
    segments = extract(str(html_file), "document", "text/html", worker=worker)
    assert "Restart the router first." in segments[1].text
    assert worker.pid != first and worker.starts == 2


def test_ballooning_extractor_is_killed_at_the_memory_ceiling(html_file, worker):
    t = time.monotonic()
    with pytest.raises(ExtractionError, match=r"extraction needed more than 300 MB \(max_extract_mb\)"):
        extract(str(html_file), "document", "text/html", MediaOptions(max_extract_mb=300), worker=worker, extractor=balloon)
    assert time.monotonic() - t < 10
    assert "Restart the router" in extract(str(html_file), "document", "text/html", worker=worker)[1].text


def test_one_huge_allocation_is_stopped_by_the_data_limit(html_file, worker):
    """Faster than the 50 ms poll: RLIMIT_DATA (twice the ceiling) turns it into a MemoryError at once."""
    t = time.monotonic()
    with pytest.raises(ExtractionError, match=r"extraction needed more than 256 MB"):
        extract(str(html_file), "document", "text/html", MediaOptions(max_extract_mb=256), worker=worker, extractor=huge)
    assert time.monotonic() - t < 5
    assert worker.pid is not None  # the worker survived its MemoryError and serves on
    assert "Restart the router" in extract(str(html_file), "document", "text/html", worker=worker)[1].text


def test_crashing_extractor_fails_its_file_only(html_file, worker):
    with pytest.raises(ExtractionError, match=r"worker died while reading this file \(killed by signal 11\)"):
        extract(str(html_file), "document", "text/html", worker=worker, extractor=crash)
    assert "Restart the router" in extract(str(html_file), "document", "text/html", worker=worker)[1].text


def test_tools_the_worker_started_are_killed_with_it(tmp_path, worker):
    pid_file = tmp_path / "tool.pid"
    job = tmp_path / "job.html"
    job.write_text(str(pid_file))
    with pytest.raises(ExtractionError, match="took longer than"):
        extract(str(job), "document", "text/html", MediaOptions(max_extract_seconds=1.5), worker=worker, extractor=spawn_and_hang)
    tool = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(tool) and psutil.Process(tool).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(tool) or psutil.Process(tool).status() == psutil.STATUS_ZOMBIE


def test_worker_killed_while_idle_is_replaced(html_file, worker):
    extract(str(html_file), "document", "text/html", worker=worker)
    os.kill(worker.pid, signal.SIGKILL)
    time.sleep(0.2)
    assert "Restart the router" in extract(str(html_file), "document", "text/html", worker=worker)[1].text
    assert worker.starts == 2


def test_interrupted_wait_kills_the_worker_so_no_late_answer_is_misread(html_file, worker):
    """Ctrl-C while a file is in the worker: that worker goes; the next file gets its own answer."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    extract(str(html_file), "document", "text/html", worker=worker)
    busy = worker.pid
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            extract(str(html_file), "document", "text/html", MediaOptions(max_extract_seconds=30), worker=worker, extractor=hang)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not psutil.pid_exists(busy) or psutil.Process(busy).status() == psutil.STATUS_ZOMBIE
    assert "Restart the router" in extract(str(html_file), "document", "text/html", worker=worker)[1].text


def test_close_stops_the_worker_and_the_next_file_starts_another(html_file, worker):
    extract(str(html_file), "document", "text/html", worker=worker)
    pid = worker.pid
    worker.close()
    assert worker.pid is None and not psutil.pid_exists(pid)
    extract(str(html_file), "document", "text/html", worker=worker)
    assert worker.starts == 2


def test_hard_deadline_defaults_to_the_timeout_plus_grace():
    assert MediaOptions(timeout_seconds=60).hard_seconds() == 60 + HARD_LIMIT_GRACE_SECONDS
    assert MediaOptions(timeout_seconds=60, max_extract_seconds=5).hard_seconds() == 5


def test_cooperative_timeout_still_names_where_it_was(tmp_path, worker):
    """The deadline checked between units of work fires before the hard kill and says what it was doing."""
    from PIL import Image

    img = tmp_path / "white.png"
    Image.new("RGB", (50, 50), "white").save(img)
    with pytest.raises(ExtractionError, match=r"timed out after 0.001s while OCR \(multimodal.timeout_seconds\)"):
        extract(str(img), "image", "image/png", MediaOptions(timeout_seconds=0.001), worker=worker)


# --- the worker's lifetime ----------------------------------------------------------------------


def _python(code: str, tmp_path: Path) -> subprocess.Popen:
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=str(tmp_path))


def test_text_only_run_never_starts_the_worker(tmp_path):
    """Markdown and transcripts are read in-process: no worker, and no media library imported.

    The script has no main guard on purpose: the worker must not re-run a parent's script.
    """
    (tmp_path / "a.md").write_text("# note\nbody\n")
    (tmp_path / "s.jsonl").write_text('{"role": "user", "content": "hi"}\n')
    proc = _python(
        """
        import sys
        from memory_pipeline.extraction import extract
        from memory_pipeline.extraction.worker import default_worker
        extract("a.md", "markdown"); extract("s.jsonl", "session")
        heavy = [m for m in ("PIL", "pypdf", "av", "faster_whisper") if m in sys.modules]
        print(default_worker().starts, heavy)
        """,
        tmp_path,
    )
    out, _ = proc.communicate(timeout=60)
    assert out.strip() == "0 []"


@pytest.mark.parametrize(
    ("thread", "job"),
    [("main", "idle"), ("main", "busy"), ("other", "idle"), ("other", "busy")],
)
def test_worker_dies_with_its_parent(tmp_path, html_file, thread, job):
    """SIGKILL the parent: the worker goes too, whether idle or busy, started from the main thread or not."""
    code = f"""
        import sys, threading, time
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from memory_pipeline.extraction import extract
        from memory_pipeline.extraction.worker import default_worker
        from memory_pipeline_tests.unit.test_extraction_isolation import hang

        def start():
            extract({str(html_file)!r}, "document", "text/html")
            print(default_worker().pid, flush=True)
            if {job!r} == "busy":
                extract({str(html_file)!r}, "document", "text/html", extractor=hang)

        if {thread!r} == "main":
            start()
        else:
            threading.Thread(target=start, daemon=True).start()
        time.sleep(1000)
        """
    proc = _python(code, tmp_path)
    try:
        pid = int(proc.stdout.readline())
        assert psutil.pid_exists(pid)
        time.sleep(0.5)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"the worker outlived its parent ({thread} thread, {job})")
