"""Images: the user's note, what the photo is (size, date taken, camera, place from EXIF), OCR text."""

from __future__ import annotations

import os
import warnings
from typing import BinaryIO

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.media import Deadline, MediaOptions, Segments, media_segment, ocr_image
from memory_pipeline.models import Segment
from memory_pipeline.safeio import OpenedFile

_EXIF_IFD = 0x8769
_GPS_IFD = 0x8825


def open_image(fh: BinaryIO, abs_path: str, options: MediaOptions):
    """A fully decoded PIL image read from ``fh``; corrupt, truncated and decompression-bomb files raise ExtractionError."""
    from PIL import Image, UnidentifiedImageError

    _register_heif()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(fh)
            w, h = img.size
            if w * h > options.max_image_pixels:
                raise ExtractionError(
                    abs_path,
                    f"image is {w}x{h} = {w * h} pixels, over multimodal.max_image_pixels={options.max_image_pixels} "
                    "(a decompression bomb or a huge scan); not decoded",
                )
            img.load()
    except ExtractionError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ExtractionError(abs_path, f"image refused as a decompression bomb: {err}") from err
    except UnidentifiedImageError as err:
        raise ExtractionError(abs_path, "not a readable image (unknown or corrupt format)") from err
    except (OSError, SyntaxError, ValueError) as err:
        raise ExtractionError(abs_path, f"image is corrupt or truncated: {err}") from err
    return img


def _register_heif() -> None:
    try:
        from pillow_heif import register_heif_opener  # pyright: ignore[reportMissingImports]  (optional extra, often absent)
    except ImportError:
        return
    register_heif_opener()


def exif_facts(img) -> list[str]:
    """Date taken, camera and GPS position, as short sentences."""
    try:
        exif = img.getexif()
    except Exception:  # noqa: BLE001 - a broken EXIF block must not lose the picture
        return []
    facts = []
    sub = exif.get_ifd(_EXIF_IFD) if exif else {}
    taken = sub.get(36867) or exif.get(306)
    if taken:
        taken = str(taken).strip("\x00 ")
        if len(taken) >= 10:
            taken = taken[:10].replace(":", "-") + taken[10:]
        facts.append(f"Taken {taken}.")
    camera = " ".join(str(exif.get(t, "")).strip("\x00 ") for t in (271, 272)).strip()
    if camera:
        facts.append(f"Camera: {camera}.")
    gps = exif.get_ifd(_GPS_IFD) if exif else {}
    if gps.get(2) and gps.get(4):
        try:
            lat = _degrees(gps[2]) * (-1 if str(gps.get(1, "N")).upper().startswith("S") else 1)
            lon = _degrees(gps[4]) * (-1 if str(gps.get(3, "E")).upper().startswith("W") else 1)
            facts.append(f"Place: {abs(lat):.4f}{'S' if lat < 0 else 'N'} {abs(lon):.4f}{'W' if lon < 0 else 'E'}.")
        except (TypeError, ValueError, ZeroDivisionError):
            pass
    desc = str(exif.get(270, "")).strip("\x00 ")
    if desc:
        facts.append(f"Description: {desc}.")
    return facts


def _degrees(value) -> float:
    d, m, s = (float(v) for v in value)
    return d + m / 60 + s / 3600


def extract_image(src: OpenedFile, mime: str, options: MediaOptions) -> list[Segment]:
    deadline = Deadline(src.path, options.timeout_seconds)
    with src.stream() as fh:
        img = open_image(fh, src.path, options)
        fmt = (img.format or mime.split("/")[-1]).upper()
        name = os.path.basename(src.path)
        about = f"Image {name} ({fmt}, {img.width}x{img.height})." + "".join(f" {f}" for f in exif_facts(img))
        segments = Segments([media_segment(about)])
        if getattr(img, "n_frames", 1) > 1:
            img.seek(0)  # an animated GIF: the first frame carries the text, if any
        lines = ocr_image(img, deadline)
    segments.extend(Segment(text=line, line_start=i, line_end=i, kind="ocr") for i, line in enumerate(lines, 1))
    return segments
