"""What every media extractor shares: options, a per-file deadline, OCR, external tools.

Extraction of one media file is bounded twice. A deadline is checked between units
of work (a page, a transcript segment, a frame) and passed to every external tool
as its timeout, so a slow file is abandoned with a reason saying where it was. And
the extractor runs in a worker process (``extraction.worker``) that is killed when
it outlives ``max_extract_seconds`` or outgrows ``max_extract_mb``, which also
catches a decoder stuck inside C code that never reaches a check.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass

from memory_pipeline.errors import ExtractionError
from memory_pipeline.models import Segment

# The hard wall-clock limit comes this long after the cooperative deadline, so an extractor
# that is between two checks can still stop itself and say where it was.
HARD_LIMIT_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class MediaOptions:
    """The extraction knobs of ``multimodal`` (and the per-file output caps) in the config."""

    pdf_max_pages: int = 100
    keyframe_seconds: float = 10.0
    timeout_seconds: float = 300.0
    max_image_pixels: int = 64_000_000
    # The worker process is killed past these: None = timeout_seconds + HARD_LIMIT_GRACE_SECONDS.
    max_extract_seconds: float | None = None
    max_extract_mb: int = 1024
    # Output of one file, any format: past either cap the file is indexed in part, with a warning.
    max_segments: int = 50_000
    max_chars: int = 20_000_000
    # Zip containers (docx): refused before parsing when they would expand past these.
    max_unzipped_bytes: int = 100 * 1024 * 1024
    max_zip_ratio: float = 100.0

    @classmethod
    def from_settings(cls, settings) -> MediaOptions:
        mm = settings.multimodal
        limits = settings.limits
        defaults = cls()
        # The newer keys are read when the settings model has them (they are optional there).
        return cls(
            pdf_max_pages=mm.pdf_max_pages,
            keyframe_seconds=mm.keyframe_seconds,
            timeout_seconds=mm.timeout_seconds,
            max_image_pixels=mm.max_image_pixels,
            max_extract_seconds=getattr(mm, "max_extract_seconds", defaults.max_extract_seconds) or None,  # 0: derived
            max_extract_mb=getattr(mm, "max_extract_mb", defaults.max_extract_mb),
            max_segments=getattr(limits, "max_segments_per_file", defaults.max_segments),
            max_chars=getattr(limits, "max_chars_per_file", defaults.max_chars),
            max_unzipped_bytes=getattr(mm, "max_unzipped_bytes", defaults.max_unzipped_bytes),
            max_zip_ratio=getattr(mm, "max_zip_ratio", defaults.max_zip_ratio),
        )

    def body_segments(self) -> int:
        """Segments a media extractor may return besides the description and the note, so the
        file's own cap (with its precise warning) is the one that applies, not ``finish``'s."""
        return max(1, self.max_segments - 2)

    def hard_seconds(self) -> float:
        """Wall-clock seconds after which the worker extracting one file is killed."""
        if self.max_extract_seconds is not None:
            return self.max_extract_seconds
        return self.timeout_seconds + HARD_LIMIT_GRACE_SECONDS


class Segments(list):
    """Segments of one file, with a warning when it was indexed only in part (a page cap)."""

    warning: str = ""

    def warn(self, message: str) -> None:
        self.warning = f"{self.warning}; {message}" if self.warning else message


class Deadline:
    def __init__(self, path: str, seconds: float) -> None:
        self.path = path
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def check(self, doing: str = "extracting") -> None:
        if self.left() <= 0:
            raise ExtractionError(self.path, f"timed out after {self.seconds:g}s while {doing} (multimodal.timeout_seconds)")


def run_tool(args: list[str], deadline: Deadline, *, data: bytes | None = None, what: str, pass_fds: tuple[int, ...] = ()) -> bytes:
    """Run an external tool within the file's deadline; its failure becomes the file's reason.

    ``pass_fds``: descriptors the tool inherits, so it reads the opened file as ``/proc/self/fd/N``.
    """
    exe = shutil.which(args[0])
    if exe is None:
        package = {"tesseract": "tesseract-ocr", "ffmpeg": "ffmpeg"}.get(args[0], args[0])
        raise ExtractionError(deadline.path, f"{what} needs `{args[0]}`, which is not installed (apt-get install {package})")
    deadline.check(what)
    try:
        proc = subprocess.run(
            [exe, *args[1:]],
            input=data,
            capture_output=True,
            timeout=max(deadline.left(), 0.1),
            check=False,
            pass_fds=pass_fds,
        )
    except subprocess.TimeoutExpired as err:
        raise ExtractionError(deadline.path, f"timed out after {deadline.seconds:g}s while {what} (multimodal.timeout_seconds)") from err
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ExtractionError(deadline.path, f"{what} failed: {tail[-1] if tail else f'exit {proc.returncode}'}")
    return proc.stdout


def ocr_image(image, deadline: Deadline) -> list[str]:
    """Text lines tesseract reads in a PIL image (grayscale, small images upscaled)."""
    import io

    from PIL import Image

    if image.mode in ("RGBA", "LA", "P", "PA"):
        # Transparent pixels are black underneath: text on them would vanish.
        rgba = image.convert("RGBA")
        image = Image.new("RGB", rgba.size, "white")
        image.paste(rgba, mask=rgba.getchannel("A"))
    img = image.convert("L")
    if img.width < 1000:
        # Tesseract reads glyphs best at ~30 px cap height; phone screenshots and thumbnails are smaller.
        scale = min(3.0, 1000 / max(img.width, 1))
        img = img.resize((int(img.width * scale), int(img.height * scale)))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    out = run_tool(["tesseract", "stdin", "stdout", "--psm", "3"], deadline, data=buf.getvalue(), what="OCR")
    return clean_ocr(out.decode("utf-8", "replace"))


def clean_ocr(text: str) -> list[str]:
    """OCR lines that read as text: at least one word of two letters; noise lines dropped."""
    lines = []
    for line in text.splitlines():
        line = " ".join(line.split())
        letters = sum(c.isalpha() for c in line)
        if letters >= 2 and letters >= len(line) * 0.4 and any(len(w) >= 2 and w.isalpha() for w in line.split()):
            lines.append(line)
    return lines


def note_segment(data: bytes) -> list[Segment]:
    """The user's note about a file (the bytes of ``<file>.note.md``), as the first segment."""
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return []
    return [Segment(text=text, line_start=0, line_end=0, kind="note")]


def media_segment(description: str) -> Segment:
    """What the file is (type, size, duration, date): every media file has it, so none is indexed empty."""
    return Segment(text=description, line_start=0, line_end=0, kind="media")


def human_duration(seconds: float) -> str:
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"
