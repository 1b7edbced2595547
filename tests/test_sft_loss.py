"""The completion-only SFT loss (training/sft_loss.py) is TRL's loss, computed more cheaply.

What must hold: on the same batch the loss and every parameter's gradient equal those of TRL's
own fused-head loss; prompt tokens carry no loss; outside the plain case (outputs requested,
a PEFT model) TRL's loss is used. With ``sft_decision_weight`` the tokens of the ``model_id``
list (a plan's workers, a review's keep-or-add) weigh that much, exactly as computed by hand,
weight 1 is the unweighted loss bit for bit, and TRL's loss refuses weights it would drop.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from _lazy import lazy
from rl_conductor.errors import ConfigError
from rl_conductor.lm.models import build_tiny
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.training.config import TrainConfig
from rl_conductor.training.data import chat
from rl_conductor.workflow import Workflow, render

if TYPE_CHECKING:
    from rl_conductor.training.sft_loss import CompletionLossSFTTrainer

# imported by the first test that uses them (tests/_lazy.py): TRL takes seconds to import
datasets = lazy("datasets")
torch = lazy("torch")
trl = lazy("trl")
sft_loss = lazy("rl_conductor.training.sft_loss")

#: a review that keeps the answer (prompts/conductor_review.txt): three empty lists
KEEP = render(Workflow(steps=()))


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> CompletionLossSFTTrainer:
    tasks = load_tasks("gsm8k")[:40]
    model_dir = build_tiny(
        [t.question for t in tasks],
        tmp_path_factory.mktemp("sft-loss") / "tiny",
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
    )
    plans = [f"model_id = [{i % 3}]\nsubtasks = ['Solve.']\naccess_list = [[]]" for i in range(12)]
    plans[3] = "model_id = [2, 0]\nsubtasks = ['Solve.', 'Check: model_id = [1]']\naccess_list = [[], 'all']"
    for i in (5, 9):
        plans[i] = KEEP
    records = [
        {"prompt": chat(f"Plan for: {t.question[:80]}"), "completion": [{"role": "assistant", "content": c}]}
        for t, c in zip(tasks, plans, strict=False)
    ]
    args = trl.SFTConfig(
        output_dir=str(tmp_path_factory.mktemp("sft-loss-work")),
        per_device_train_batch_size=6,
        completion_only_loss=True,
        max_length=1024,
        use_cpu=True,
        bf16=False,  # SFTConfig's default is True: mixed precision takes TRL's path (see below)
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return sft_loss.CompletionLossSFTTrainer(
        model=str(model_dir), args=args, train_dataset=datasets.Dataset.from_list(records)
    )


def _batch(trainer: CompletionLossSFTTrainer) -> dict[str, Any]:
    batch = next(iter(trainer.get_train_dataloader()))
    return {k: v for k, v in batch.items()}


def _training(trainer: CompletionLossSFTTrainer) -> tuple[Any, dict[str, Any]]:
    """The trainer's model, switched to training mode, and a batch of its data."""
    model = trainer.model
    model.train()
    return model, _batch(trainer)


def _loss_and_grads(fn: Any, model: torch.nn.Module) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss = fn()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


def test_loss_and_gradients_equal_trls(trainer: CompletionLossSFTTrainer) -> None:
    model, batch = _training(trainer)
    ours, g_ours = _loss_and_grads(lambda: trainer.compute_loss(model, dict(batch)), model)
    theirs, g_theirs = _loss_and_grads(
        lambda: trl.SFTTrainer.compute_loss(trainer, model, dict(batch)), model
    )
    assert ours == pytest.approx(theirs, rel=1e-5) and ours > 0
    assert g_ours.keys() == g_theirs.keys() and len(g_ours) > 0
    for name, g in g_ours.items():
        torch.testing.assert_close(g, g_theirs[name], rtol=1e-4, atol=1e-6, msg=name)
    # with Trainer's divisor: the tokens of every micro-batch of an accumulated step (here as if
    # two micro-batches of this size), still TRL's
    n = (batch["labels"][:, 1:] != -100).sum()
    for items in (n, 2 * n, n + 7):
        ours_n = trainer.compute_loss(model, dict(batch), num_items_in_batch=items)
        theirs_n = trl.SFTTrainer.compute_loss(trainer, model, dict(batch), num_items_in_batch=items)
        assert float(ours_n) == pytest.approx(float(theirs_n), rel=1e-5)
    halved = trainer.compute_loss(model, dict(batch), num_items_in_batch=2 * n)
    assert float(halved) == pytest.approx(ours / 2)


def test_prompt_tokens_carry_no_loss(trainer: CompletionLossSFTTrainer) -> None:
    model = trainer.model
    batch = _batch(trainer)
    loss, n, top1 = sft_loss.completion_nll(model, batch)
    completion = int((batch["labels"][:, 1:] != -100).sum())
    assert int(n) == completion and 0 < completion < int(batch["attention_mask"].sum())
    assert 0 <= int(top1) <= completion
    # the mean NLL of the completion tokens, from the model's full logits
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    target = batch["labels"][:, 1:]
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    manual = -(picked * (target != -100)).sum() / completion
    assert float(loss) == pytest.approx(float(manual), rel=1e-5)
    # a token taken out of the completion leaves the count and the loss
    labels = batch["labels"].clone()
    row, col = (labels[:, 1:] != -100).nonzero()[0].tolist()
    labels[row, col + 1] = -100
    loss2, n2, _ = sft_loss.completion_nll(model, {**batch, "labels": labels})
    assert int(n2) == completion - 1 and float(loss2) != pytest.approx(float(loss), rel=1e-9)


def test_outside_the_plain_case_trls_loss_is_used(
    trainer: CompletionLossSFTTrainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, batch = _training(trainer)
    calls: list[bool] = []
    real = trl.SFTTrainer.compute_loss

    def spy(self: Any, *a: Any, **k: Any) -> Any:
        calls.append(True)
        return real(self, *a, **k)

    monkeypatch.setattr(trl.SFTTrainer, "compute_loss", spy)
    trainer.compute_loss(model, dict(batch))
    assert calls == []  # the plain case: ours
    with pytest.warns(FutureWarning):
        trainer.compute_loss(model, dict(batch), return_outputs=True)
    assert len(calls) == 1
    trainer.compute_loss(model, {**batch, "position_ids": torch.arange(batch["input_ids"].shape[1])[None]})
    assert len(calls) == 2  # an input this path would drop
    with monkeypatch.context() as m:
        m.setattr(trainer.args, "loss_type", "dft")
        trainer.compute_loss(model, dict(batch))
    assert len(calls) == 3
    with monkeypatch.context() as m:
        m.setattr(type(trainer.accelerator), "mixed_precision", property(lambda self: "bf16"))
        trainer.compute_loss(model, dict(batch))
    assert len(calls) == 4  # accelerate autocasts model.forward, which this path does not call
    with monkeypatch.context() as m:
        m.setattr(model.config, "final_logit_softcapping", 30.0, raising=False)
        trainer.compute_loss(model, dict(batch))
    assert len(calls) == 5
    model.eval()
    try:
        trainer.compute_loss(model, dict(batch))  # evaluation: TRL's (and its metrics)
    finally:
        model.train()
    assert len(calls) == 6


def test_training_uses_this_loss_and_logs_token_accuracy(
    trainer: CompletionLossSFTTrainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*a: Any, **k: Any) -> Any:
        raise AssertionError("TRL's loss was used in training")

    monkeypatch.setattr(trl.SFTTrainer, "compute_loss", never)
    trainer.args.num_train_epochs = 1
    trainer.args.logging_steps = 1
    trainer.args.output_dir = str(tmp_path)
    tokens = int(sum(b["attention_mask"].sum() for b in trainer.get_train_dataloader()))
    before = trainer._total_train_tokens  # the other tests' calls count too
    out = trainer.train()
    assert out.training_loss > 0
    logged = [h for h in trainer.state.log_history if "mean_token_accuracy" in h]
    assert logged and all(0.0 <= h["mean_token_accuracy"] <= 1.0 for h in logged)
    # every token of the epoch, prompt and padding included
    assert logged[-1]["num_tokens"] == before + tokens


def _completions(batch: dict[str, Any]) -> list[list[int]]:
    return [[t for t in row if t != -100] for row in batch["labels"][:, 1:].tolist()]


def _by_hand_mask(ids: list[int], tok: Any) -> list[bool]:
    """The model_id list's tokens found another way: each token's own decoded length summed
    (the completions are ASCII) against the first ``model_id = [...]`` a regex finds."""
    import re

    text = "".join(tok.decode([t]) for t in ids)
    m = re.search(r"model_id = (\[[^\]]*\])", text)
    assert m is not None, text
    mask, at = [], 0
    for t in ids:
        end = at + len(tok.decode([t]))
        mask.append(at < m.end(1) and end > m.start(1))
        at = end
    return mask


def test_decision_tokens_are_the_model_id_list_of_plans_and_reviews(
    trainer: CompletionLossSFTTrainer,
) -> None:
    tok = trainer.processing_class
    rows = [_completions(b) for b in trainer.get_train_dataloader()]
    seen = {"keep": 0, "pair": 0}
    for ids in (ids for batch in rows for ids in batch):
        mask = sft_loss.decision_mask(ids, tok)
        assert mask == _by_hand_mask(ids, tok)
        picked = "".join(tok.decode([t]) for t, f in zip(ids, mask, strict=True) if f)
        text = tok.decode(ids)
        if text.startswith(KEEP):
            seen["keep"] += 1
            assert picked == "[]"  # keep-vs-add is decided by the empty list alone
        elif text.startswith("model_id = [2, 0]"):
            seen["pair"] += 1
            assert picked == "[2, 0]"  # not the list quoted inside an instruction
        else:
            assert picked in ("[0]", "[1]", "[2]")
    assert seen == {"keep": 2, "pair": 1}
    with pytest.raises(ValueError, match="no model_id list"):
        sft_loss.decision_mask(tok.encode("subtasks = ['Solve.']"), tok)


def test_decision_weight_multiplies_those_tokens_loss_exactly(
    trainer: CompletionLossSFTTrainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, batch = _training(trainer)
    today = sft_loss.completion_nll(model, dict(batch))[0]
    assert trainer.decision_weight == 1.0 and trainer.decision_weights(batch["labels"]) is None
    assert torch.equal(trainer.compute_loss(model, dict(batch)), today)  # bit for bit
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    target = batch["labels"][:, 1:]
    keep = target != -100
    nll = -torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, target.clamp(min=0)[..., None])[
        ..., 0
    ]
    nll = nll[keep].double()
    flags = torch.tensor(
        [f for ids in _completions(batch) for f in _by_hand_mask(ids, trainer.processing_class)]
    )
    assert flags.shape == nll.shape and 0 < int(flags.sum()) < len(flags)
    n = len(flags)
    for w in (5.0, 0.5):
        monkeypatch.setattr(trainer, "decision_weight", w)
        by_hand = float((nll * torch.where(flags, w, 1.0)).sum() / n)
        assert float(trainer.compute_loss(model, dict(batch))) == pytest.approx(by_hand, rel=1e-5)
        # with Trainer's divisor (tokens of an accumulated step) the weights stay on the sum
        got = trainer.compute_loss(model, dict(batch), num_items_in_batch=3 * n)
        assert float(got) == pytest.approx(by_hand / 3, rel=1e-5)
    assert by_hand != pytest.approx(float(today), rel=1e-3)


def test_trls_loss_refuses_decision_weights_it_would_drop(
    trainer: CompletionLossSFTTrainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, batch = _training(trainer)
    monkeypatch.setattr(trainer, "decision_weight", 5.0)
    position_ids = torch.arange(batch["input_ids"].shape[1])[None]
    with pytest.raises(ConfigError, match="sft_decision_weight = 5 needs the completion-only SFT loss"):
        trainer.compute_loss(model, {**batch, "position_ids": position_ids})
    with monkeypatch.context() as m:
        m.setattr(type(trainer.accelerator), "mixed_precision", property(lambda self: "bf16"))
        with pytest.raises(ConfigError, match="sft_decision_weight"):
            trainer.compute_loss(model, dict(batch))
    model.eval()
    try:  # evaluation is TRL's plain loss (no weights to drop in training)
        assert float(trainer.compute_loss(model, dict(batch))) > 0
    finally:
        model.train()


def test_the_config_field_defaults_to_one_and_is_checked() -> None:
    assert TrainConfig().sft_decision_weight == 1.0
    assert TrainConfig(sft_decision_weight=10.0).sft_decision_weight == 10.0
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="sft_decision_weight"):
            TrainConfig(sft_decision_weight=bad)
    with pytest.raises(ConfigError, match="LoRA and bf16"):
        TrainConfig(model="smol", use_lora=True, sft_decision_weight=5.0)
    with pytest.raises(ConfigError, match="LoRA and bf16"):
        TrainConfig(bf16=True, sft_decision_weight=5.0)


def test_the_warm_start_trains_with_the_configured_weight(
    trainer: CompletionLossSFTTrainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_conductor.training import train as train_mod

    seen: list[tuple[float, int]] = []
    real = sft_loss.CompletionLossSFTTrainer.compute_loss

    def spy(self: CompletionLossSFTTrainer, model: Any, inputs: dict[str, Any], *a: Any, **k: Any) -> Any:
        w = self.decision_weights(inputs["labels"])
        seen.append((self.decision_weight, 0 if w is None else int((w == self.decision_weight).sum())))
        return real(self, model, inputs, *a, **k)

    monkeypatch.setattr(sft_loss.CompletionLossSFTTrainer, "compute_loss", spy)
    records = [
        {"prompt": chat(f"Plan {i}"), "completion": [{"role": "assistant", "content": KEEP}]}
        for i in range(4)
    ]
    cfg = TrainConfig(sft_decision_weight=7.0, sft_batch_size=4, sft_epochs=1.0)
    train_mod._sft(cfg, Path(trainer.model.name_or_path), records, tmp_path / "sft", progress=False)
    assert seen and all(w == 7.0 and k > 0 for w, k in seen)
    assert (tmp_path / "sft" / "config.json").exists()


def test_padding_only_after_each_rows_last_token() -> None:
    labels = torch.tensor([[-100, 5, 6, -100], [-100, 7, -100, -100]])
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert sft_loss.padding_only_after(right, labels)
    assert not sft_loss.padding_only_after(
        torch.ones_like(right), labels
    )  # no padding: transformers' own path
    assert not sft_loss.padding_only_after(torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]]), labels)  # left-padded
    assert not sft_loss.padding_only_after(torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0]]), labels)  # a hole
    assert not sft_loss.padding_only_after(right, torch.tensor([[-100, 5, 6, 9], [-100, 7, -100, -100]]))
    assert not sft_loss.padding_only_after(torch.tensor([[1, 1, 2, 0], [1, 1, 0, 0]]), labels)
    assert not sft_loss.padding_only_after(None, labels)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_right_padded_batches_give_the_masked_loss_and_gradients_bit_for_bit(
    trainer: CompletionLossSFTTrainer,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    kv_heads: int,
) -> None:
    """With padding only after each row, causal attention (is_causal, skipping the blocks above
    the diagonal) stands in for the padding mask: the same loss and every gradient bit for bit,
    with key/value heads shared (grouped-query: 2 query heads per key/value head) or not."""
    import importlib

    from transformers import AttentionInterface, AutoModelForCausalLM

    module = importlib.import_module("rl_conductor.training.sft_loss")  # not the lazy stand-in

    model_dir = build_tiny(
        [t.question for t in load_tasks("gsm8k")[:40]],
        tmp_path_factory.mktemp("sft-loss-gqa") / "tiny",
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,  # with one key/value head: grouped-query attention
        num_key_value_heads=kv_heads,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.config._attn_implementation == "sdpa"
    model.train()
    batch = _batch(trainer)
    assert int((batch["attention_mask"] == 0).sum()) > 0  # the collator padded it (on the right)
    assert sft_loss.padding_only_after(batch["attention_mask"], batch["labels"])
    masks: list[Any] = []
    real = AttentionInterface._global_mapping[sft_loss.CAUSAL_SDPA]

    def spy(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **k: Any) -> Any:
        masks.append(attention_mask)
        return real(module, query, key, value, attention_mask, **k)

    monkeypatch.setitem(AttentionInterface._global_mapping, sft_loss.CAUSAL_SDPA, spy)
    causal, g_causal = _loss_and_grads(lambda: sft_loss.completion_nll(model, dict(batch))[0], model)
    layers = model.config.num_hidden_layers
    assert len(masks) == layers and all(m is None for m in masks)  # every layer ran the causal kernel
    assert model.config._attn_implementation == "sdpa"  # switched back
    with monkeypatch.context() as m:
        m.setattr(module, "padding_only_after", lambda *a: False)
        masked, g_masked = _loss_and_grads(lambda: sft_loss.completion_nll(model, dict(batch))[0], model)
    assert len(masks) == layers  # the masked path never came here
    assert causal == masked and g_causal.keys() == g_masked.keys() and len(g_causal) > 0
    for name, g in g_causal.items():
        assert torch.equal(g, g_masked[name]), name
    # a batch without padding keeps transformers' own path (there grouped-query attention runs in
    # the kernel, whose key/value gradients are summed in another order)
    full = {k: v[:1, : int(batch["attention_mask"][0].sum())] for k, v in batch.items()}
    sft_loss.completion_nll(model, full)
    assert len(masks) == layers
