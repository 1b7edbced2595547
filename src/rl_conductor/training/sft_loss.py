"""The SFT loss computed on the completion tokens only: the warm start's cost on CPU.

Why: TRL's ``SFTTrainer`` (1.16) always computes the loss through its fused LM head, a chunked
log-softmax that also yields each token's entropy and top-1 hit, over *every* position of the
batch. The Conductor's warm start trains on prompts of ~230 tokens (the worker list, the limits,
the question) and completions of ~40 (the plan), with ``completion_only_loss``: the prompt
positions carry no loss, yet on CPU that chunked head took a third of each SFT step (figures:
``benchmarks/README.md``, "SFT loss"). Applying the LM head to the completion positions only
gives the same loss — the mean negative log-likelihood of the completion tokens — at a fraction
of the cost.

Scope: a plain (not PEFT-wrapped) causal LM in full precision, one process, padded and unpacked
batches of ``input_ids``/``attention_mask``/``labels``, TRL's plain NLL: the CPU presets' case.
Anything else keeps TRL's own loss, which is built for it: LoRA, mixed precision (accelerate
autocasts ``model.forward``, which this path does not call), several processes, packing or
padding-free batches, MoE auxiliary losses, ``loss_type="dft"``, label smoothing, a custom
``compute_loss_func``, models that scale or soft-cap their logits, batches with other inputs
(position ids, images), evaluation and callers that want the outputs.

Decision weighting (``TrainConfig.sft_decision_weight``): in a plan of ~25 completion tokens the
worker ids are one or two, so a model that always names the most common worker already scores a
low mean loss; it learns the format and not the choice. A weight ``w`` multiplies the NLL of the
tokens that carry the decision — those that overlap the ``model_id`` list literal (brackets
included) of the decoded completion, the list :func:`rl_conductor.workflow.parse` reads: which
workers a plan runs, and whether a review keeps (``[]``) or adds steps. The divisor stays the
token count (Trainer's ``num_items_in_batch``), so ``w`` raises those tokens' share of the
gradient without changing how the others are scaled. The tokens are found from the labels
alone (each completion decoded token by token through the trainer's tokenizer), so no column
is added to TRL's dataset or collator. ``w = 1`` runs exactly the unweighted code. TRL's own loss
cannot weight tokens: where it would be used in training with ``w != 1``, training stops with an
error instead of silently dropping the weights.

Attention on padded batches (:func:`completion_nll`): the collator pads each batch on the right
to its longest row, so transformers' ``sdpa`` attention gets a causal-and-padding mask, with
which PyTorch's CPU flash kernel scores every query against every key. The padding only ever
follows a row's last real token, so causality alone already keeps every real token from seeing
a pad: such batches run on the CPU with ``is_causal`` instead (:data:`CAUSAL_SDPA`), which
skips the keys after each query block. The values and gradients at the real tokens are the same
bit for bit (the pad positions differ, and carry no loss and no gradient; the trained weights
are the same), and an SFT step costs less CPU time. Batches without
padding keep transformers' own path: there it runs the kernel's grouped-query mode, whose
key/value gradients are summed in another order than ``repeat_kv``'s, so switching those would
change the trained weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from trl import SFTTrainer

from rl_conductor.errors import ConfigError
from rl_conductor.workflow import list_span

IGNORE_INDEX = -100


def decision_mask(ids: Sequence[int], tokenizer: Any) -> list[bool]:
    """Which of a completion's tokens carry its decision: those whose characters overlap the
    ``model_id`` list literal of the decoded completion (:func:`rl_conductor.workflow.list_span`).
    Each token's end is the length of the decoded prefix up to it (a running maximum, so a
    multi-byte character split over tokens never moves an end backwards).

    Raises:
        ValueError: the completion has no ``model_id`` list (nothing to weight: every SFT target
            of this project is a rendered plan or review).
    """
    kw = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
    text = tokenizer.decode(list(ids), **kw)
    span = list_span(text)
    if span is None:
        raise ValueError(f"sft_decision_weight: a completion has no model_id list: {text[:120]!r}")
    start, end = span
    mask, prev = [], 0
    for i in range(len(ids)):
        here = min(max(prev, len(tokenizer.decode(list(ids[: i + 1]), **kw))), len(text))
        mask.append(prev < end and here > start)
        prev = here
    return mask


#: the attention implementation :func:`completion_nll` runs right-padded batches with
#: (:func:`causal_sdpa`, registered with transformers' ``AttentionInterface``)
CAUSAL_SDPA = "conductor_causal_sdpa"


def causal_sdpa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention with a padding mask, computed with ``is_causal`` instead:
    key and value heads repeated (``repeat_kv``) as that path repeats them when a mask is given,
    then the kernel's causal mode. Anything else (a mask, a cache, a sliding window, a position
    bias, soft-capping, a non-causal module) goes to transformers' own ``sdpa`` function."""
    plain = (
        attention_mask is None
        and query.shape[2] > 1
        and query.shape[2] == key.shape[2]
        and getattr(module, "is_causal", True)
        and kwargs.get("sliding_window") is None
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and not kwargs.get("output_attentions", False)
    )
    if not plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    out = F.scaled_dot_product_attention(query, key, value, dropout_p=dropout, scale=scaling, is_causal=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(CAUSAL_SDPA, causal_sdpa)


def padding_only_after(attention_mask: torch.Tensor | None, labels: torch.Tensor) -> bool:
    """Whether a batch has padding, all of it after each row's last real token (a right-padded
    batch, as TRL's collator makes), and no label on it: then causal attention alone gives every
    real token the values the padding mask would."""
    if attention_mask is None or attention_mask.dim() != 2 or attention_mask.shape != labels.shape:
        return False
    real = attention_mask != 0
    if bool(real.all()) or not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        return False
    return (
        bool(real[:, 0].all())
        and not bool((real[:, 1:] & ~real[:, :-1]).any())
        and bool((labels[~real] == IGNORE_INDEX).all())
    )


@contextlib.contextmanager
def _attention(config: Any, implementation: str) -> Iterator[None]:
    before = config._attn_implementation
    config._attn_implementation = implementation
    try:
        yield
    finally:
        config._attn_implementation = before


def completion_nll(
    model: Any,
    inputs: dict[str, torch.Tensor],
    num_items_in_batch: torch.Tensor | int | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, n_tokens, n_top1)``: the summed NLL of the tokens whose label is not
    ``IGNORE_INDEX`` (labels aligned with ``input_ids``, shifted here as in a causal LM's own
    loss) divided by ``num_items_in_batch`` (default: those tokens' count), with the count and
    how many of them the model ranks first (for the token-accuracy metric). ``weights`` (one per
    such token, in row-major order) multiply each token's NLL in the sum; the divisor stays the
    count."""
    labels = inputs["labels"]
    decoder = model.get_decoder()
    attention_mask = inputs.get("attention_mask")
    causal = (  # verified bit for bit on PyTorch's CPU kernel only
        inputs["input_ids"].device.type == "cpu"
        and decoder.config._attn_implementation == "sdpa"
        and padding_only_after(attention_mask, labels)
    )
    with _attention(decoder.config, CAUSAL_SDPA) if causal else contextlib.nullcontext():
        hidden = decoder(
            input_ids=inputs["input_ids"], attention_mask=None if causal else attention_mask, use_cache=False
        ).last_hidden_state
    target = labels[:, 1:]
    mask = target != IGNORE_INDEX
    logits = model.get_output_embeddings()(hidden[:, :-1][mask]).float()
    wanted = target[mask]
    if weights is None:
        nll = F.cross_entropy(logits, wanted, reduction="sum")
    else:
        nll = (F.cross_entropy(logits, wanted, reduction="none") * weights.to(logits.device)).sum()
    n = mask.sum()
    denom = n if num_items_in_batch is None else torch.as_tensor(num_items_in_batch, device=nll.device)
    loss = nll / denom.clamp(min=1)
    with torch.no_grad():
        top1 = (logits.argmax(dim=-1) == wanted).sum()
    return loss, n, top1


class CompletionLossSFTTrainer(SFTTrainer):
    """``SFTTrainer`` whose training loss applies the LM head to completion tokens only (see the
    module docstring); falls back to TRL's loss outside that case. ``decision_weight`` multiplies
    the loss of the decision tokens (:func:`decision_mask`)."""

    def __init__(self, *args: Any, decision_weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decision_weight = float(decision_weight)
        self._decision_masks: dict[tuple[int, ...], list[bool]] = {}

    def decision_weights(self, labels: torch.Tensor) -> torch.Tensor | None:
        """One weight per loss token of ``labels`` (row-major, as :func:`completion_nll` takes
        them): ``decision_weight`` on decision tokens, 1 elsewhere; None when the weight is 1."""
        if self.decision_weight == 1.0:
            return None
        out: list[bool] = []
        for row in labels[:, 1:].tolist():
            ids = tuple(t for t in row if t != IGNORE_INDEX)
            if ids not in self._decision_masks:
                self._decision_masks[ids] = decision_mask(ids, self.processing_class)
            out += self._decision_masks[ids]
        flags = torch.tensor(out, dtype=torch.bool)
        return torch.where(flags, self.decision_weight, 1.0).to(torch.float32)

    def _completion_only_applies(self, model: Any, inputs: dict[str, Any]) -> bool:
        config = getattr(model, "config", None)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        scaled = any(
            getattr(text_config, k, None) not in (None, 1.0)
            for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")
        )
        return (
            model.training
            and not hasattr(model, "get_base_model")  # PEFT: TRL's path
            and self.accelerator.mixed_precision == "no"
            and self.accelerator.num_processes == 1
            and not self.aux_loss_enabled
            and not self.args.packing
            and not getattr(self.args, "padding_free", False)
            and self.args.loss_type == "nll"
            and self.label_smoother is None
            and self.compute_loss_func is None
            and not scaled
            and set(inputs) == {"input_ids", "attention_mask", "labels"}
            and callable(getattr(model, "get_decoder", None))
        )

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        if return_outputs or not self._completion_only_applies(model, inputs):
            if self.decision_weight != 1.0 and model.training:
                raise ConfigError(
                    f"sft_decision_weight = {self.decision_weight:g} needs the completion-only SFT loss "
                    "(a plain full-precision model in one process, unpacked batches, TRL's nll loss; "
                    "training/sft_loss.py): TRL's own loss would ignore it. Set sft_decision_weight: 1.0"
                )
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        loss, n, top1 = completion_nll(
            model, inputs, num_items_in_batch, self.decision_weights(inputs["labels"])
        )
        metrics = self._metrics["train"]
        metrics["mean_token_accuracy"].append((top1 / n).item() if n > 0 else 0.0)
        self._total_train_tokens += int(inputs["attention_mask"].sum().item())
        metrics["num_tokens"] = [self._total_train_tokens]
        return loss
