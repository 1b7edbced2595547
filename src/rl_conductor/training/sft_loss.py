"""The SFT loss computed on the completion tokens only: the warm start's cost on CPU.

Why: TRL's ``SFTTrainer`` (1.16) always computes the loss through its fused LM head, a chunked
log-softmax that also yields each token's entropy and top-1 hit, over *every* position of the
batch. The Conductor's warm start trains on prompts of ~230 tokens (the worker list, the limits,
the question) and completions of ~40 (the plan), with ``completion_only_loss``: the prompt
positions carry no loss, yet on 2 CPU cores that chunked head took 37 % of each SFT step
(measured on the tiny preset at hidden size 192: 0.47 of 1.26 s a step). Applying the LM head
to the completion positions only gives the same loss — the mean negative log-likelihood of the
completion tokens — at a fraction of the cost.

Scope: a plain (not PEFT-wrapped) causal LM in full precision, one process, padded and unpacked
batches of ``input_ids``/``attention_mask``/``labels``, TRL's plain NLL: the CPU presets' case.
Anything else keeps TRL's own loss, which is built for it: LoRA, mixed precision (accelerate
autocasts ``model.forward``, which this path does not call), several processes, packing or
padding-free batches, MoE auxiliary losses, ``loss_type="dft"``, label smoothing, a custom
``compute_loss_func``, models that scale or soft-cap their logits, batches with other inputs
(position ids, images), evaluation and callers that want the outputs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from trl import SFTTrainer

IGNORE_INDEX = -100


def completion_nll(
    model: Any, inputs: dict[str, torch.Tensor], num_items_in_batch: torch.Tensor | int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, n_tokens, n_top1)``: the summed NLL of the tokens whose label is not
    ``IGNORE_INDEX`` (labels aligned with ``input_ids``, shifted here as in a causal LM's own
    loss) divided by ``num_items_in_batch`` (default: those tokens' count), with the count and
    how many of them the model ranks first (for the token-accuracy metric)."""
    labels = inputs["labels"]
    hidden = model.get_decoder()(
        input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"), use_cache=False
    ).last_hidden_state
    target = labels[:, 1:]
    mask = target != IGNORE_INDEX
    logits = model.get_output_embeddings()(hidden[:, :-1][mask]).float()
    wanted = target[mask]
    nll = F.cross_entropy(logits, wanted, reduction="sum")
    n = mask.sum()
    denom = n if num_items_in_batch is None else torch.as_tensor(num_items_in_batch, device=nll.device)
    loss = nll / denom.clamp(min=1)
    with torch.no_grad():
        top1 = (logits.argmax(dim=-1) == wanted).sum()
    return loss, n, top1


class CompletionLossSFTTrainer(SFTTrainer):
    """``SFTTrainer`` whose training loss applies the LM head to completion tokens only (see the
    module docstring); falls back to TRL's loss outside that case."""

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
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        loss, n, top1 = completion_nll(model, inputs, num_items_in_batch)
        metrics = self._metrics["train"]
        metrics["mean_token_accuracy"].append((top1 / n).item() if n > 0 else 0.0)
        self._total_train_tokens += int(inputs["attention_mask"].sum().item())
        metrics["num_tokens"] = [self._total_train_tokens]
        return loss
