"""A byte-level BPE tokenizer for the `tiny` Conductor, trained on the project's own corpus.

Why it exists: the `tiny` model is built from nothing, so it needs a vocabulary fitted to the
text it will read and write (task questions, prompts, rendered workflows). A vocabulary of a
few thousand tokens keeps the embedding matrix, and with it the model, near 1M parameters.

The pitfall it avoids: a folder whose `config.json` says `model_type: qwen2` reloads through
`AutoTokenizer` as `Qwen2Tokenizer`, which rebuilds the pipeline with Qwen's NFC normalizer,
Qwen's split regex and a byte-level step. A BPE trained with any other pre-tokenizer would
tokenize differently after the reload. So the trainer here uses exactly Qwen's pipeline, and
`save -> AutoTokenizer.from_pretrained` round-trips token ids exactly.

Deliberate simplifications: no byte fallback or unknown token (the 256 byte symbols are all in
the initial alphabet, so every string encodes); three special tokens only (`<|endoftext|>`,
`<|im_start|>`, `<|im_end|>`); a minimal ChatML template without tool calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Copied from transformers.models.qwen2.tokenization_qwen2 (transformers 5.24): Qwen2Tokenizer
# rebuilds its pre-tokenizer from this pattern whatever tokenizer.json says.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# ChatML, as Qwen2.5-Instruct writes it, without its tool-calling branches and default system
# prompt. `add_generation_prompt` opens an assistant turn; the model ends it with <|im_end|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _qwen2_pipeline(tokenizer: Tokenizer) -> None:
    """Give `tokenizer` exactly the normalizer, pre-tokenizer and decoder of Qwen2Tokenizer."""
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()


def _texts(corpus: Iterable[str]) -> Iterator[str]:
    for text in corpus:
        if not isinstance(text, str):
            raise TypeError(f"corpus items must be str, got {type(text).__name__}")
        if text:
            yield text


def train_bpe(corpus: Iterable[str], *, vocab_size: int = 2048) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE on `corpus` and wrap it as a transformers tokenizer.

    The result has eos `<|im_end|>` (the end of an assistant turn), pad `<|endoftext|>`, no
    bos, and the ChatML template above. Special tokens take ids 0, 1, 2. The vocabulary may
    end up smaller than `vocab_size` when the corpus has fewer distinct merges.
    """
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} (bytes + specials)")
    bpe = Tokenizer(
        models.BPE(
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    _qwen2_pipeline(bpe)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_texts(corpus), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START],
        model_max_length=2048,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped
