"""The Conductor's models: tiny builds and trains, tokenizers round-trip, generation, smol, embeddings."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from _lazy import lazy
from rl_conductor.lm.generate import apply_chat, generate, load_lm, torch_threads
from rl_conductor.lm.models import build_smol, build_tiny, resolve_model
from rl_conductor.policies.knn_embed import EMBED_DIM, embed
from rl_conductor.workflow import Step, Workflow, render

torch = lazy("torch")

SAMPLES = [
    "What is 17 * 23? Show your work.",
    "Natalia sold clips to 48 of her friends in April, and half as many in May. How many in all?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Which planet is known as the Red Planet? (A) Venus (B) Mars (C) Jupiter (D) Saturn",
    "Héllo wörld — naïve café, ½ cup, 日本語, emoji 🙂, tabs\tand  double  spaces\r\nend",
    "I'm sure they'll say it's fine; we'd've known.   \n\n\n trailing",
]
INSTRUCTIONS = [
    "Solve the problem step by step.",
    "Check the solution above and give the final answer.",
    "Write Python code that solves the task.",
    "Answer the question directly.",
]


def _corpus(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = list(SAMPLES)
    for _ in range(n):
        steps = tuple(
            Step(rng.randrange(7), rng.choice(INSTRUCTIONS), "all" if i and rng.random() < 0.5 else ())
            for i in range(rng.randint(1, 4))
        )
        texts.append(render(Workflow(steps)))
        texts.append(
            f"Question: what is {rng.randint(1, 999)} + {rng.randint(1, 999)}? {rng.choice(SAMPLES)}"
        )
    return texts


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine two spinning
    OpenMP threads made greedy decoding ~25x slower than one (measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    start = time.perf_counter()
    out = build_tiny(_corpus(), tmp_path_factory.mktemp("tiny"), vocab_size=1024)
    assert time.perf_counter() - start < 60
    return out


def test_tiny_is_a_small_qwen2_with_the_tokenizers_vocabulary(tiny_dir: Path) -> None:
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert (tiny_dir / "model.safetensors").is_file()
    model, tokenizer = load_lm(tiny_dir)
    assert model.config.vocab_size == len(tokenizer) <= 1024
    assert 200_000 < sum(p.numel() for p in model.parameters()) < 1_500_000
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert model.config.eos_token_id == tokenizer.eos_token_id


def test_tiny_build_is_deterministic_for_a_seed(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    again = build_tiny(_corpus(), tmp_path / "again", vocab_size=1024)
    first, second = load_file(tiny_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(t.dtype == torch.float32 for t in first.values())
    assert all(torch.equal(first[k], second[k]) for k in first)
    other = build_tiny(_corpus(), tmp_path / "other", vocab_size=1024, seed=1)
    third = load_file(other / "model.safetensors")
    assert not all(torch.equal(first[k], third[k]) for k in first)


def test_tokenizer_reloads_as_qwen2_with_identical_ids(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    from rl_conductor.lm.tokenizer import train_bpe

    trained = train_bpe(_corpus(), vocab_size=1024)
    reloaded = AutoTokenizer.from_pretrained(tiny_dir)
    # The pitfall: model_type qwen2 reloads through Qwen2Tokenizer's own pipeline.
    assert type(reloaded).__name__ == "Qwen2Tokenizer"
    workflow = (
        'Think first.\nmodel_id = [1, 3]\nsubtasks = ["Solve it.", "Check it."]\naccess_list = [[], "all"]'
    )
    texts = [*SAMPLES, "<|im_start|>user\nhi<|im_end|>\n", "ﬁ ẞ 0123456789 x", workflow]
    for text in texts:
        ids = trained(text, add_special_tokens=False)["input_ids"]
        assert reloaded(text, add_special_tokens=False)["input_ids"] == ids
        assert reloaded.decode(ids) == text
    # NFC normalisation is part of the pipeline: the Angstrom sign becomes Å on both sides.
    angstrom = trained("\u212b", add_special_tokens=False)["input_ids"]
    assert reloaded("\u212b", add_special_tokens=False)["input_ids"] == angstrom
    assert reloaded.decode(angstrom) == "\u00c5"
    specials = reloaded("<|im_start|>assistant\nok<|im_end|>", add_special_tokens=False)["input_ids"]
    assert specials[0] == reloaded.convert_tokens_to_ids("<|im_start|>")
    assert specials[-1] == reloaded.eos_token_id


def test_apply_chat_writes_chatml(tiny_dir: Path) -> None:
    _, tokenizer = load_lm(tiny_dir)
    text = apply_chat(tokenizer, "You plan.", "What is 2+2?")
    assert text == (
        "<|im_start|>system\nYou plan.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert apply_chat(tokenizer, "", "hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_trains_one_step(tiny_dir: Path) -> None:
    model, tokenizer = load_lm(tiny_dir)
    model.train()
    batch = tokenizer(_corpus(4, seed=7)[-4:], return_tensors="pt", padding=True, add_special_tokens=False)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = model(**batch, labels=labels).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    with torch.no_grad():
        after = model(**batch, labels=labels).loss
    assert after.item() < loss.item()
    changed = [n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert len(changed) == len(before)


def test_generate_greedy_is_deterministic_and_sampling_is_seeded(tiny_dir: Path) -> None:
    model, tokenizer = load_lm(tiny_dir)
    prompts = [apply_chat(tokenizer, "", "What is 2+2?"), apply_chat(tokenizer, "Plan.", SAMPLES[1])]
    greedy = [generate(model, tokenizer, prompts, max_new_tokens=12, greedy=True) for _ in range(2)]
    assert greedy[0] == greedy[1] and len(greedy[0]) == 2
    # Left padding: a prompt's completion does not depend on its batch neighbour.
    assert generate(model, tokenizer, prompts[:1], max_new_tokens=12, greedy=True) == greedy[0][:1]
    torch.manual_seed(123)
    state = torch.get_rng_state()
    sampled = generate(model, tokenizer, prompts, max_new_tokens=12, num_return_sequences=3, seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    assert len(sampled) == 6
    assert sampled == generate(model, tokenizer, prompts, max_new_tokens=12, num_return_sequences=3, seed=5)
    assert sampled != generate(model, tokenizer, prompts, max_new_tokens=12, num_return_sequences=3, seed=6)
    with pytest.raises(ValueError):
        generate(model, tokenizer, prompts, max_new_tokens=4, temperature=0.0)


def test_torch_threads_sets_the_count_for_the_block_and_generation_is_the_same_on_one_or_two(
    tiny_dir: Path,
) -> None:
    model, tokenizer = load_lm(tiny_dir)
    prompts = [apply_chat(tokenizer, "", q) for q in ("What is 2+2?", SAMPLES[2] * 3)]
    before = torch.get_num_threads()
    texts = {}
    for n in (2, 1):
        with torch_threads(n):
            assert torch.get_num_threads() == n
            texts[n] = generate(model, tokenizer, prompts, max_new_tokens=12, seed=3)
        assert torch.get_num_threads() == before
    assert texts[1] == texts[2]
    with torch_threads(None):
        assert torch.get_num_threads() == before


def test_resolve_model_specs(tiny_dir: Path, tmp_path: Path) -> None:
    assert resolve_model("tiny", tiny_dir) == tiny_dir  # already built: no corpus needed
    assert resolve_model(str(tiny_dir), tmp_path / "unused") == tiny_dir
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct", tmp_path / "hf") == "Qwen/Qwen2.5-7B-Instruct"
    assert not (tmp_path / "hf").exists()
    with pytest.raises(ValueError, match="corpus"):
        resolve_model("tiny", tmp_path / "fresh")
    built = resolve_model("tiny", tmp_path / "fresh", corpus=_corpus(20))
    assert (Path(built) / "config.json").is_file()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        resolve_model(str(tmp_path / "empty"), tmp_path / "x")
    with pytest.raises(ValueError, match="unknown model spec"):
        resolve_model("not a model", tmp_path / "y")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smol_unpacks_from_gguf_and_answers(tmp_path: Path) -> None:
    out = build_smol(tmp_path / "smol")
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert (out / "model.safetensors").stat().st_size > 400 * 2**20
    model, tokenizer = load_lm(out)
    assert 130_000_000 < sum(p.numel() for p in model.parameters()) < 140_000_000
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    prompt = apply_chat(tokenizer, "You are a helpful assistant.", "What is the capital of France?")
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == prompt
    (answer,) = generate(model, tokenizer, [prompt], max_new_tokens=12, greedy=True)
    assert "Paris" in answer
    model.train()
    batch = tokenizer([prompt + "Paris."], return_tensors="pt", add_special_tokens=False)
    model(**batch, labels=batch["input_ids"]).loss.backward()
    assert model.get_input_embeddings().weight.grad is not None


def test_embed_gives_unit_vectors_that_rank_paraphrases_closest() -> None:
    texts = [
        "How many apples does Tom have after buying three more?",
        "Tom buys three more apples; how many apples does he have now?",
        "Write a Python function that reverses a linked list.",
        "Which planet is known as the Red Planet?",
    ]
    vectors = embed(texts, batch_size=3)
    assert vectors.shape == (4, EMBED_DIM) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > 0.7
    assert similarity[0, 1] > max(similarity[0, 2], similarity[0, 3]) + 0.3
    # Batching by length keeps the input order.
    np.testing.assert_allclose(embed(texts[2:3])[0], vectors[2], atol=1e-5)
    assert embed([]).shape == (0, EMBED_DIM)


def test_a_warm_start_example_longer_than_the_window_is_refused_with_what_to_shorten(tiny_dir: Path) -> None:
    """A pool of many workers with long descriptions makes prompts the SFT window would cut from
    the end — the target plan first — so training refuses them and says what to shorten."""
    from transformers import AutoTokenizer

    from rl_conductor.errors import ConfigError
    from rl_conductor.training.train import check_sft_lengths

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    short = {"prompt": [{"role": "user", "content": "0: gpt-5\n1: gemma\nQuestion: 2+2?"}]}
    short["completion"] = [{"role": "assistant", "content": "model_id = [1]"}]
    assert 0 < check_sft_lengths([short], tok, 1024) < 1024
    lines = "\n".join(f"{i}: a worker whose pool file describes it at great length, " * 8 for i in range(40))
    long = {"prompt": [{"role": "user", "content": lines}], "completion": short["completion"]}
    with pytest.raises(
        ConfigError, match=r"1 of 2 warm-start examples are longer than the 1024-token"
    ) as err:
        check_sft_lengths([short, long], tok, 1024)
    assert "descriptions in the pool file" in str(err.value)
    assert check_sft_lengths([short, long], tok, 20_000) > 1024  # a bigger window takes it
