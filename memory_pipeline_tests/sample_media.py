"""Deterministic sample media: text images (Pillow), speech (espeak-ng), a video (ffmpeg), PDFs and a docx.

``python -m memory_pipeline_tests.sample_media data/sample/media`` writes the media of the
shipped sample memory; the tests build their media with the same functions. The
same inputs give the same bytes on every run (fixed sizes, no timestamps in the
files: ffmpeg runs with ``-bitexact``, the PDFs are written by hand).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile
import wave
import zipfile
from datetime import UTC, datetime
from pathlib import Path

FONT_SIZE = 34


def _font(size: int = FONT_SIZE):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)  # Pillow's bundled font: the same glyphs everywhere


def text_image(path: Path, lines: list[str], *, size=(900, 600), fmt: str | None = None, background="white", exif: dict | None = None) -> Path:
    """An image with lines of large black text (a receipt, a whiteboard, a screenshot)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, background)
    draw = ImageDraw.Draw(img)
    font = _font()
    for i, line in enumerate(lines):
        draw.text((40, 40 + i * int(FONT_SIZE * 1.9)), line, fill="black", font=font)
    kwargs = {}
    if exif:
        ex = Image.Exif()
        for tag, value in exif.items():
            ex[tag] = value
        kwargs["exif"] = ex
    fmt = fmt or {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".gif": "GIF", ".webp": "WEBP"}.get(path.suffix.lower(), "PNG")
    if fmt == "JPEG":
        kwargs["quality"] = 90
    img.save(path, format=fmt, **kwargs)
    return path


def _need(tool: str) -> str:
    exe = shutil.which(tool)
    if exe is None:
        raise RuntimeError(f"{tool} is not installed (make installs it: apt-get install {'espeak-ng' if tool == 'espeak-ng' else tool})")
    return exe


def speech_wav(path: Path, text: str, *, speed: int = 150) -> Path:
    """Spoken English from espeak-ng (deterministic for the same text and voice)."""
    subprocess.run([_need("espeak-ng"), "-v", "en-us", "-s", str(speed), "-w", str(path), text], check=True, capture_output=True)
    return path


def transcode(src: Path, dest: Path, *args: str) -> Path:
    """ffmpeg: ``src`` to ``dest`` (format from the extension), bit-exact output."""
    subprocess.run(
        [_need("ffmpeg"), "-nostdin", "-v", "error", "-y", "-i", str(src), *args, "-fflags", "+bitexact", "-map_metadata", "-1", str(dest)],
        check=True,
        capture_output=True,
    )
    return dest


def speech_audio(path: Path, text: str) -> Path:
    """Speech in the format of ``path``'s extension (.wav, .mp3, .ogg, .m4a, .flac)."""
    if path.suffix.lower() == ".wav":
        return speech_wav(path, text)
    with tempfile.TemporaryDirectory() as tmp:
        wav = speech_wav(Path(tmp) / "speech.wav", text)
        return transcode(wav, path, "-ac", "1")


def video(path: Path, speech: str | None, slide_lines: list[str], *, seconds: float | None = None) -> Path:
    """A short video: a slide with on-screen text, and spoken audio when ``speech`` is given."""
    ffmpeg = _need("ffmpeg")
    with tempfile.TemporaryDirectory() as tmp:
        slide = text_image(Path(tmp) / "slide.png", slide_lines, size=(960, 540))
        cmd = [ffmpeg, "-nostdin", "-v", "error", "-y", "-loop", "1", "-framerate", "2", "-i", str(slide)]
        if speech:
            wav = speech_wav(Path(tmp) / "speech.wav", speech)
            with wave.open(str(wav)) as w:
                length = w.getnframes() / w.getframerate()
            cmd += ["-i", str(wav), "-c:a", "aac", "-b:a", "48k", "-t", f"{length + 0.5:.2f}"]
        else:
            cmd += ["-t", str(seconds or 4)]
        cmd += ["-c:v", "libx264", "-preset", "veryfast", "-tune", "stillimage", "-pix_fmt", "yuv420p", "-r", "2",
                "-threads", "1", "-fflags", "+bitexact", "-flags:v", "+bitexact", "-flags:a", "+bitexact",
                "-map_metadata", "-1", str(path)]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
    return path


def _pdf_bytes(objects: list[bytes]) -> bytes:
    """A PDF file from its numbered objects (1..n, object 1 the catalog), with a correct xref table."""
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for off in offsets:
        out += f"{off:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def text_pdf(path: Path, pages: list[list[str]]) -> Path:
    """A PDF whose pages carry the given lines as real text (Helvetica)."""
    n = len(pages)
    font_obj = 3 + 2 * n
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", ("<< /Type /Pages /Kids [" + " ".join(f"{3 + 2 * i} 0 R" for i in range(n)) + f"] /Count {n} >>").encode()]
    for i, lines in enumerate(pages):
        ops = ["BT", "/F1 14 Tf", "16 TL", "72 760 Td"] + [f"({_escape(line)}) Tj T*" for line in lines] + ["ET"]
        stream = "\n".join(ops).encode("latin-1")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 {font_obj} 0 R >> >> /Contents {4 + 2 * i} 0 R >>".encode()
        )
        objects.append(f"<< /Length {len(stream)} >>\nstream\n".encode() + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    path.write_bytes(_pdf_bytes(objects))
    return path


def scanned_pdf(path: Path, lines: list[str]) -> Path:
    """An image-only PDF (a 'scan'): one page holding a JPEG of the text, no text layer."""
    from PIL import Image

    buf = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp:
        img_path = text_image(Path(tmp) / "scan.png", lines, size=(1200, 700))
        with Image.open(img_path) as img:
            img.convert("RGB").save(buf, format="JPEG", quality=90)
            w, h = img.size
    data = buf.getvalue()
    content = b"q 540 0 0 315 36 400 cm /Im1 Do Q"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /XObject << /Im1 5 0 R >> >> /Contents 4 0 R >>",
        f"<< /Length {len(content)} >>\nstream\n".encode() + content + b"\nendstream",
        f"<< /Type /XObject /Subtype /Image /Width {w} /Height {h} /ColorSpace /DeviceRGB /BitsPerComponent 8 /Filter /DCTDecode /Length {len(data)} >>\nstream\n".encode()
        + data
        + b"\nendstream",
    ]
    path.write_bytes(_pdf_bytes(objects))
    return path


def docx_file(path: Path, title: str, paragraphs: list[str], table: list[list[str]] | None = None) -> Path:
    import docx

    document = docx.Document()
    fixed = datetime(2026, 11, 1, tzinfo=UTC)
    document.core_properties.created = fixed
    document.core_properties.modified = fixed
    document.add_heading(title, level=1)
    for p in paragraphs:
        document.add_paragraph(p)
    if table:
        t = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, value in enumerate(row):
                t.cell(r, c).text = value
    buf = io.BytesIO()
    document.save(buf)
    # Zip entries carry the time of writing: rewrite them with a fixed one, for the same bytes every run.
    out = io.BytesIO()
    with zipfile.ZipFile(buf) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(zipfile.ZipInfo(info.filename, date_time=(2026, 11, 1, 0, 0, 0)), src.read(info.filename), zipfile.ZIP_DEFLATED)
    path.write_bytes(out.getvalue())
    return path


def write_note(media_path: Path, note: str) -> Path:
    note_path = media_path.with_name(media_path.name + ".note.md")
    note_path.write_text(note.strip() + "\n", encoding="utf-8")
    return note_path


RECEIPT_LINES = ["ACME CORP", "Vendor receipt no. 4417", "2026-11-05  Rotterdam", "Espresso machine descaling  42.00", "TOTAL EUR 42.00"]
WHITEBOARD_LINES = ["Q1 ROADMAP", "1. Route optimizer v2", "2. Courier mobile app", "3. Warehouse scanning"]
VOICE_NOTE = "Remind me to renew the passport before the trip to Lisbon in February."
DEMO_SPEECH = "This demo shows the new dashboard with live delivery maps for each courier."


def write_sample(dest: Path) -> list[Path]:
    """The shipped sample's media, with notes."""
    dest.mkdir(parents=True, exist_ok=True)
    made = [
        text_image(dest / "acme-receipt.jpg", RECEIPT_LINES, exif={306: "2026:11:05 14:12:00", 271: "Google", 272: "Pixel 8"}),
        text_image(dest / "whiteboard-roadmap.png", WHITEBOARD_LINES),
        speech_audio(dest / "voice-note-passport.mp3", VOICE_NOTE),
        video(dest / "dashboard-demo.mp4", DEMO_SPEECH, ["NEW DASHBOARD", "Live delivery map"]),
        text_pdf(
            dest / "courier-contract.pdf",
            [
                ["Courier services agreement", "Between Parcelwise B.V. and Snelkoerier Zuid", "Term: twelve months from 2026-12-01"],
                ["Service levels", "Same-day delivery before 18:00 for 98 percent of parcels", "Penalty: 2 percent of the monthly fee per missed point"],
            ],
        ),
        docx_file(
            dest / "oncall-handbook.docx",
            "On-call handbook",
            ["Page the secondary after fifteen minutes without an acknowledgement.", "Postmortems are blameless and due within five working days."],
            [["Service", "Owner"], ["routing-api", "Dana"], ["tracking-web", "Joris"]],
        ),
    ]
    write_note(made[0], "Vendor receipt from Acme Corp meeting")
    write_note(made[3], "Product demo showing new dashboard feature")
    return made


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    dest = Path(args[0] if args else "data/sample/media")
    for p in write_sample(dest):
        print(f"{os.path.getsize(p):>8}  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
