"""In-process generation with a Conductor LM: load a folder, format a chat prompt, sample completions.

Why it exists: evaluation, serving and tests need the Conductor's text for a prompt without the
training stack; TRL's GRPOTrainer does its own sampling during training, and this module
mirrors its settings (left padding, plain temperature sampling, no top-k/top-p) so what is
evaluated is what was trained.

Deliberate simplifications: prompts are tokenized without extra special tokens (the chat
template already writes every marker, and neither Qwen2 nor SmolLM2 uses a BOS token); the
returned text drops special tokens, so a completion ends where `<|im_end|>` was; sampling is
seeded through a forked torch RNG, so a call never disturbs the caller's random state, but
results may differ across torch versions and devices.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_conductor.workflow import LIST_ASSIGN

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def load_lm(path: str | Path, device: str = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a folder (or a hub id where the hub is reachable).

    The model is in eval mode, fp32 on CPU and the checkpoint's dtype elsewhere; the tokenizer
    pads on the left, falling back to eos when it has no pad token.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    dtype: Any = torch.float32 if device == "cpu" else "auto"
    # Typed as Any: transformers' stubs mistype `PreTrainedModel.to` and `.generate` for mypy.
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.to(device)
    model.eval()
    # checkpoints written by trainers carry use_cache=false; generation needs the KV cache
    model.config.use_cache = True
    if model.generation_config is not None:
        model.generation_config.use_cache = True
    return model, tokenizer


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with torch on ``n`` CPU threads (None: as it is), then restore the count.

    Why: evaluation ran the tiny Conductor on torch's default of one thread per core, while it
    trains on its config's ``torch_threads``; its small matrix products gain nothing from more
    threads but their synchronisation, and on a loaded 2-core machine two threads made its
    generation and the routers' embeddings many times slower than one, with the same outputs.
    The count is process-wide (torch has no other), so concurrent callers should agree on it.
    """
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(n)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def trained_threads(meta: Mapping[str, Any]) -> int | None:
    """The ``torch_threads`` a Conductor trained with, from its ``conductor.json`` (None: not recorded)."""
    n = (meta.get("train_config") or {}).get("torch_threads")
    return int(n) if n else None


def apply_chat(tokenizer: PreTrainedTokenizerBase, system: str, user: str) -> str:
    """Render a system + user exchange with the tokenizer's chat template, opening the reply.

    An empty `system` is left out (the template may then insert its own default).
    """
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": user})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):
        raise TypeError("the chat template did not render to text")
    return text


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    greedy: bool = False,
    num_return_sequences: int = 1,
    seed: int = 0,
    batch_size: int = 32,
    allowed_ids: Sequence[frozenset[int] | None] | None = None,
) -> list[str]:
    """Complete each prompt; return `len(prompts) * num_return_sequences` texts.

    Completions for one prompt are adjacent, in prompt order. Prompts are batched (at most
    `batch_size` prompts a forward pass) with left padding. `greedy` ignores `temperature`
    and is deterministic; sampling is reproducible for a given `seed`. `allowed_ids` (one entry
    per prompt; None = unconstrained) restricts the ids a completion may write in its
    ``model_id = [...]`` list (:class:`WorkerIdConstraint`).
    """
    import torch

    if num_return_sequences < 1 or batch_size < 1:
        raise ValueError("num_return_sequences and batch_size must be at least 1")
    if not greedy and temperature <= 0:
        raise ValueError("temperature must be positive when sampling (or pass greedy=True)")
    if allowed_ids is not None and len(allowed_ids) != len(prompts):
        raise ValueError("allowed_ids needs one entry per prompt")
    if tokenizer.padding_side != "left":
        tokenizer.padding_side = "left"
    lm: Any = model  # see load_lm: keeps mypy off transformers' mistyped `generate`
    device = next(lm.parameters()).device
    settings: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "num_return_sequences": num_return_sequences,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "use_cache": True,
    }
    if greedy:
        settings.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        settings.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    texts: list[str] = []
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.inference_mode():
        torch.manual_seed(seed)
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(
                prompts[start : start + batch_size],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
            ).to(device)
            extra: dict[str, Any] = {}
            rows = None if allowed_ids is None else list(allowed_ids[start : start + batch_size])
            if rows is not None and any(r is not None for r in rows):
                from transformers import LogitsProcessorList

                per_row = [r for r in rows for _ in range(num_return_sequences)]
                constraint = WorkerIdConstraint(tokenizer, per_row, batch["input_ids"].shape[1])
                extra["logits_processor"] = LogitsProcessorList([constraint])
            output = lm.generate(**batch, **settings, **extra)
            new_tokens = output[:, batch["input_ids"].shape[1] :]
            texts.extend(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
    return texts


#: The open ``model_id`` list at the end of a completion so far (the ids written, and the rest).
_OPEN_LIST = re.compile(LIST_ASSIGN["model_id"].pattern + r"([^\]]*)$")  # opened as parse reads it
_DIGITS = re.compile(r"(?<![@\d])\d+")  # a run after "@" is a rank reference (workflow.parse), not an id


def ids_prefix_ok(body: str, allowed: frozenset[int]) -> bool:
    """Whether ``body`` (the text of an open ``model_id`` list so far) can still become a list of
    ``allowed`` ids: every finished run of digits in it is an allowed id and a run still being
    written (at the end) is a prefix of one. Other text is left alone (parsing judges it), and so
    is a rank reference (``@1``: the prompt's ranking holds only workers the request may use, and
    the Conductor checks the resolved id against the same set)."""
    words = {str(i) for i in allowed}
    for m in _DIGITS.finditer(body):
        run = m.group().lstrip("0") or "0"
        if m.end() == len(body):
            if not any(w.startswith(m.group()) or w.startswith(run) for w in words):
                return False
        elif run not in words:
            return False
    return True


@functools.lru_cache(maxsize=4)
def _id_tokens(tokenizer: PreTrainedTokenizerBase) -> dict[int, str]:
    """The tokens that can change which ids a list holds (those with a digit, a comma or a
    closing bracket), with their text; once per tokenizer (a large vocabulary takes seconds)."""
    out = {}
    for t in range(len(tokenizer)):
        s = tokenizer.decode([t])
        if any(ch.isdigit() or ch in ",]" for ch in s):
            out[t] = s
    return out


class WorkerIdConstraint:
    """A logits processor: inside a completion's ``model_id = [...]`` list, tokens that would
    write an id outside that row's allowed set get ``-inf``.

    Why: a request's limits rule some workers out before the Conductor plans (a private request,
    an allow-list, a budget a worker's typical answer exceeds). A plan naming such a worker is
    cut or refused by the executor and loses the answer; masking its id while decoding lets the
    model's own next choice among the workers it may use stand instead (action masking). Rows
    with ``None`` are untouched; the rest of the text is never constrained, so a completion that
    leaves the format still fails to parse as before.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, allowed: Sequence[frozenset[int] | None], prompt_len: int
    ) -> None:
        self.tokenizer = tokenizer
        self.allowed = list(allowed)
        self.prompt_len = prompt_len
        self.text = _id_tokens(tokenizer)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        for row, allowed in enumerate(self.allowed):
            if allowed is None:
                continue
            done = self.tokenizer.decode(input_ids[row, self.prompt_len :], skip_special_tokens=True)
            m = _OPEN_LIST.search(done)
            if m is None:
                continue
            body = m.group(1)
            bad = [t for t, piece in self.text.items() if not ids_prefix_ok(body + piece, allowed)]
            if bad:
                scores[row, bad] = float("-inf")
        return scores
