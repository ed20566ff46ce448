"""Video: the user's note, the audio track's transcript and the OCR text of keyframes.

A frame is taken every ``multimodal.keyframe_seconds`` (by the ffmpeg program, into a
temporary folder) and read with tesseract; consecutive frames showing the same text
become one segment spanning their times.
"""

from __future__ import annotations

import os
import tempfile

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.audio import load_audio, transcribe
from memory_pipeline.extraction.media import (
    Deadline,
    MediaOptions,
    Segments,
    human_duration,
    media_segment,
    ocr_image,
    run_tool,
)
from memory_pipeline.models import Segment
from memory_pipeline.safeio import OpenedFile


def probe(src: OpenedFile) -> tuple[float, bool, int, int]:
    """(duration in seconds, has an audio track, width, height) from the container."""
    import av

    try:
        with src.stream() as fh, av.open(fh) as container:
            video = container.streams.video
            if not video:
                raise ExtractionError(src.path, "no video stream in the file")
            # av.open's stubs give an input container only for mode="r"; a file object opened "rb" is one too
            duration = (container.duration or 0) / 1_000_000  # pyright: ignore[reportAttributeAccessIssue]
            return duration, bool(container.streams.audio), video[0].width, video[0].height
    except ExtractionError:
        raise
    except Exception as err:  # PyAV's error types (InvalidDataError, …)
        raise ExtractionError(src.path, f"cannot read the video container: {err}") from err


def keyframe_text(src: OpenedFile, every: float, deadline: Deadline) -> list[Segment]:
    from PIL import Image

    with tempfile.TemporaryDirectory(prefix="memory-frames-") as tmp:
        run_tool(
            ["ffmpeg", "-nostdin", "-v", "error", "-i", src.tool_path(), "-an",
             "-vf", f"fps=1/{every:g},scale='min(1600,iw)':-2", "-fps_mode", "vfr", os.path.join(tmp, "f%06d.png")],
            deadline,
            what="extracting keyframes",
            pass_fds=(src.fd,),
        )  # fmt: skip
        segments: list[Segment] = []
        for i, name in enumerate(sorted(os.listdir(tmp))):
            at = int(i * every * 1000)
            with Image.open(os.path.join(tmp, name)) as frame:
                text = "\n".join(ocr_image(frame, deadline))
            if not text:
                continue
            last = segments[-1] if segments else None
            if last is not None and last.text == text and last.line_end >= at - int(every * 1000):
                segments[-1] = Segment(text, last.line_start, at, kind="frame")
            else:
                segments.append(Segment(text, at, at, kind="frame"))
            deadline.check("reading keyframes")
        return segments


def extract_video(src: OpenedFile, mime: str, options: MediaOptions) -> list[Segment]:
    deadline = Deadline(src.path, options.timeout_seconds)
    duration, has_audio, width, height = probe(src)
    spoken: list[Segment] = []
    if has_audio:
        spoken, _ = transcribe(src, deadline, samples=load_audio(src, deadline))
    shown = keyframe_text(src, options.keyframe_seconds, deadline)
    name = os.path.basename(src.path)
    about = f"Video {name} ({mime}, {width}x{height}, {human_duration(duration)} long"
    about += ")." if has_audio else ", no sound)."
    if has_audio and not spoken:
        about += " No speech was recognised."
    segments = Segments([media_segment(about)])
    segments.extend(spoken)
    segments.extend(shown)
    return segments
