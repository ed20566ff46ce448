"""Runtimes for the local model: torch, or the same weights exported to ONNX and run by
onnxruntime or OpenVINO, optionally with int8 weights.

The export is done here, offline, from the model folder on disk (``torch.onnx.export`` of the
transformer; pooling and normalisation stay in numpy, with the same math as the torch path).
int8 is dynamic per-channel quantisation of the MatMul weights (``onnxruntime.quantization``).
Both are written once into the model cache and reused by every later run and process:

    $MEMORY_PIPELINE_MODEL_CACHE, else $XDG_CACHE_HOME/memory_pipeline/models, else
    ~/.cache/memory_pipeline/models

A cached export is keyed by the model folder's files (path, size, modification time) and
:data:`EXPORT_VERSION`, so replacing the weights exports again. Concurrent first runs (several
shard processes) take a file lock; the loser reuses the winner's file. Nothing is downloaded.

An ONNX or OpenVINO run imports neither torch nor transformers once the export exists: start-up
is onnxruntime (or openvino) plus the ``tokenizers`` library.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memory_pipeline.errors import MemoryPipelineError, ProviderUnavailable
from memory_pipeline.providers.base import stable_key

RUNTIMES = ("torch", "onnx", "openvino")
QUANTIZE = ("none", "int8")
# Bumped when the export or quantisation recipe changes: old exports are then made again.
EXPORT_VERSION = 1
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class Runtime:
    """Which engine runs the local model, and with which weights."""

    engine: str = "torch"
    quantize: str = "none"

    def __post_init__(self) -> None:
        if self.engine not in RUNTIMES:
            raise ValueError(f"unknown runtime {self.engine!r}")
        if self.quantize not in QUANTIZE:
            raise ValueError(f"unknown quantisation {self.quantize!r}")
        if self.engine == "torch" and self.quantize != "none":
            raise ValueError("int8 needs runtime onnx or openvino")

    @property
    def label(self) -> str:
        return self.engine if self.quantize == "none" else f"{self.engine}-{self.quantize}"


def every_runtime() -> list[Runtime]:
    return [Runtime(engine, quantize) for engine in RUNTIMES for quantize in QUANTIZE if engine != "torch" or quantize == "none"]


def model_cache_root() -> Path:
    explicit = os.environ.get("MEMORY_PIPELINE_MODEL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memory_pipeline" / "models"


def model_signature(model_path: Path) -> str:
    """A cheap key of the model folder's content: every file's relative path, size and mtime."""
    parts: list[object] = [EXPORT_VERSION, str(model_path.resolve())]
    for path in sorted(p for p in model_path.rglob("*") if p.is_file() and not p.name.startswith(".")):
        st = path.stat()
        parts += [path.relative_to(model_path).as_posix(), st.st_size, st.st_mtime_ns]
    return stable_key(*parts)


def _unavailable(model: str, what: str, err: BaseException | str) -> ProviderUnavailable:
    return ProviderUnavailable(
        f"cannot {what} local model {model}: {err}",
        provider="local",
        hint="run make run to install the runtime packages, or set local.runtime: torch",
    )


@contextlib.contextmanager
def _locked(folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def exported_model(model_path: Path, model: str, quantize: str, fused: bool = False) -> Path:
    """The ONNX file of this model (int8 when asked), exported on first use and cached.

    ``fused`` (fp32 for onnxruntime only): the graph with onnxruntime's transformer fusions
    (see :func:`_fuse`), when the model is one they apply to; else the plain export.
    """
    folder = model_cache_root() / f"{model_path.name}-{model_signature(model_path)}"
    fp32 = folder / "model.onnx"
    fused_path = folder / "model-fused.onnx"
    unfusable = folder / "model-fused.unfusable"
    if not fp32.is_file():
        unfusable.unlink(missing_ok=True)  # a new export is judged afresh
    if quantize == "none" and fused:
        target = fp32 if unfusable.is_file() else fused_path
    else:
        target = fp32 if quantize == "none" else folder / f"model-{quantize}.onnx"
    if target.is_file():
        return target
    try:
        with _locked(folder):
            if not fp32.is_file():
                _export(model_path, fp32, model)
            if target == fused_path and not target.is_file():
                if not _fuse(model_path, fp32, fused_path, model):
                    unfusable.write_text("onnxruntime's transformer fusions do not apply to this model\n")
                    target = fp32
            elif target != fp32 and not target.is_file():
                _quantize(fp32, target, model)
            (folder / "source.json").write_text(json.dumps({"model": model, "path": str(model_path), "export_version": EXPORT_VERSION}))
    except OSError as err:
        raise _unavailable(model, f"write the exported model to {folder} for", err) from err
    return target


@contextlib.contextmanager
def _written_atomically(dest: Path, model: str, what: str):
    """A temporary path beside ``dest`` for a step to write; renamed onto ``dest`` when the step
    succeeds, deleted when it fails. A failure other than OSError (the exporter and the quantiser
    raise many types) is reported as the model being unavailable for ``what``."""
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=".export-", suffix=".onnx")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, dest)
    except Exception as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, (OSError, MemoryPipelineError)):
            raise
        raise _unavailable(model, what, err) from err


def _export(model_path: Path, dest: Path, model: str) -> None:
    try:
        import torch
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging
    except ImportError as err:
        raise _unavailable(model, "export (torch and transformers are needed once)", err) from err
    hf_logging.disable_progress_bar()
    try:
        # Eager attention: the fused kernels do not trace to ONNX.
        net = AutoModel.from_pretrained(str(model_path), attn_implementation="eager")
    except Exception as err:  # the library raises many types for a broken model folder
        raise _unavailable(model, "load", err) from err
    net.eval()

    class _Hidden(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: ANN001 - traced
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state

    sample = torch.ones((2, 8), dtype=torch.long)
    axes = {"batch": 0, "tokens": 1}
    dynamic = {name: {axes["batch"]: "batch", axes["tokens"]: "tokens"} for name in (*INPUT_NAMES, "last_hidden_state")}
    import warnings

    with _written_atomically(dest, model, "export to ONNX") as tmp, warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Hidden(net),
            (sample, sample, torch.zeros_like(sample)),
            str(tmp),
            dynamo=False,
            input_names=list(INPUT_NAMES),
            output_names=["last_hidden_state"],
            dynamic_axes=dynamic,
            opset_version=17,
        )


# config.json model types whose graphs onnxruntime's BERT fusions understand.
FUSABLE_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra")


def _fuse(model_path: Path, src: Path, dest: Path, model: str) -> bool:
    """Write ``src`` with onnxruntime's transformer fusions to ``dest``; False when they do not apply.

    Each layer's attention becomes one ``Attention`` kernel, residual + layer norm one
    ``SkipLayerNormalization``, bias + GELU one ``BiasGelu`` (onnxruntime's contrib operators, so
    onnxruntime only: OpenVINO keeps the plain graph). The math is the same: on 800 SciFact
    abstracts every vector had cosine 1.0000 with the plain graph's, and embedding them took 21.9 s
    instead of 26.3 s (torch: 28.4 s) on 2 cores.
    """
    try:
        config = json.loads((model_path / "config.json").read_text())
        kind = str(config.get("model_type", ""))
        heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if kind not in FUSABLE_MODEL_TYPES:
        return False
    try:
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError:
        return False
    optimized = None
    try:
        with _written_atomically(dest, model, "fuse") as tmp:
            optimized = optimize_model(
                str(src), model_type="bert" if kind != "distilbert" else kind, num_heads=heads, hidden_size=hidden, opt_level=0, use_gpu=False
            )
            if not optimized.get_fused_operator_statistics().get("Attention"):
                raise _Unfused
            optimized.save_model_to_file(str(tmp))
            if not _same_outputs(src, tmp, int(config.get("vocab_size", 1000))):
                raise _Unfused
    except (_Unfused, ProviderUnavailable):
        return False
    return True


def _same_outputs(plain: Path, fused: Path, vocab: int) -> bool:
    """Both graphs give the same hidden states (cosine ≥ 0.9999 per token) on a padded sample."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    ids = rng.integers(1000, max(vocab, 1001), size=(2, 24), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 17:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    outs = []
    for path in (plain, fused):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        outs.append(np.asarray(session.run(None, {k: v for k, v in feeds.items() if k in names})[0], dtype=np.float64))
    a, b = outs
    if a.shape != b.shape:
        return False
    live = mask.astype(bool)
    a, b = a[live], b[live]
    cos = (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)
    return bool(np.all(cos >= 0.9999))


class _Unfused(Exception):
    """The fusions found no attention block to fuse: the plain graph is used."""


def _quantize(src: Path, dest: Path, model: str) -> None:
    try:
        import logging

        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as err:
        raise _unavailable(model, "quantise", err) from err
    quiet = logging.getLogger()
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its 'consider pre-processing' advice is for image models
    try:
        with _written_atomically(dest, model, "quantise") as tmp:
            # Per-channel int8 MatMul weights, activations quantised at run time: the recipe that
            # kept MiniLM's vectors closest to fp32 (cosine ≥ 0.98 on every test text).
            quantize_dynamic(
                str(src), str(tmp), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"], extra_options={"MatMulConstBOnly": True}
            )
    finally:
        quiet.setLevel(level)


def _engine(module: str, model: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise _unavailable(model, f"run ({module} is not installed)", err) from err


def _loaded(opener: Callable[[], Any], path: Path, model: str, verb: str) -> Any:
    try:
        return opener()
    except Exception as err:  # a damaged cached file (each engine raises its own types): say where it is
        raise _unavailable(model, f"{verb} the exported model {path} (delete it to export again) for", err) from err


class OnnxSession:
    """The exported transformer in onnxruntime: token arrays in, last hidden state out."""

    def __init__(self, path: Path, model: str) -> None:
        ort = _engine("onnxruntime", model)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # onnxruntime's worker threads spin on the CPU after each run by default, waiting for the
        # next: between two queries that is CPU taken from LanceDB and the search's own threads. On 2
        # cores a warm vector search (embedding included) took 27.5 ms spinning and 12 ms without;
        # embedding 800 documents in batches took the same time either way (22.0-22.5 s).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # Batches are sized by tokens, so nearly every batch has a shape of its own; onnxruntime's
        # memory patterns plan (and keep) an allocation layout per input shape, and its arena grew
        # with each new one: embedding the same 1,735 long chunks three times at varied lengths
        # left RSS at 641, 737, then 790 MB; without patterns 567, 571, 572 MB, in the same time
        # (21.7 s against 21.9 s a round). Disabling the arena instead cost 30 % more time.
        options.enable_mem_pattern = False
        # One thread per run, and the provider runs passes side by side (``concurrent`` below): the
        # int8 default runs each text alone, passes too small for two threads to share. 600 long
        # notes, one per pass, 2 cores: 7.2-7.7 s on one session's two threads, 5.4 s on two
        # callers of one single-threaded session (the same memory; two sessions 5.6 s, +58 MB).
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = _loaded(lambda: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]), path, model, "open")
        self._inputs = [i.name for i in self._session.get_inputs()]

    # onnxruntime's ``run`` may be called from several threads at once.
    concurrent = True

    def __call__(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(self._session.run(None, {k: feeds[k] for k in self._inputs})[0])


class OpenVinoSession:
    """The exported transformer compiled by OpenVINO for this CPU (compiled blobs cached too)."""

    def __init__(self, path: Path, model: str) -> None:
        ov = _engine("openvino", model)
        core = ov.Core()
        with contextlib.suppress(Exception):  # the blob cache only speeds the next compile
            core.set_property({"CACHE_DIR": str(path.parent / "openvino-cache")})
        self._compiled = _loaded(lambda: core.compile_model(core.read_model(str(path)), "CPU", {"PERFORMANCE_HINT": "LATENCY"}), path, model, "compile")
        self._inputs = [i.get_any_name() for i in self._compiled.inputs]
        self._request = self._compiled.create_infer_request()

    concurrent = False  # one infer request: one pass at a time (OpenVINO threads each pass itself)

    def __call__(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        result = self._request.infer({k: feeds[k] for k in self._inputs})
        return np.asarray(result[self._compiled.output(0)])


def open_session(runtime: Runtime, model_path: Path, model: str) -> OnnxSession | OpenVinoSession:
    path = exported_model(model_path, model, runtime.quantize, fused=runtime.engine == "onnx")
    if runtime.engine == "openvino":
        return OpenVinoSession(path, model)
    return OnnxSession(path, model)
