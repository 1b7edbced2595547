"""The LM Conductor as a Policy: prompt → generate → parse → (retry | fallback) → workflow.

It loads a trained model folder (weights, tokenizer, ``conductor.json``), plans greedily by
default and batches generation across tasks (``run_many``). On an unparseable plan it samples
``retries`` more times; if none parses it falls back to a documented default plan — one step on
the view's highest-priced permitted worker, which is the safest single choice a platform team
would make by hand — and marks the plan (``Plan.fallback``, ``Trace.fallback_plan``).

When a workflow names the Conductor itself (id = pool size), the recursion hook renders the
recursive prompt (parent workflow + answer so far), generates an inner workflow and executes it
one level deeper; three empty lists keep the answer.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_conductor.errors import InvalidSpec, model_not_found
from rl_conductor.executor import RecursionRequest, execute
from rl_conductor.policies.base import Episode, Plan, Policy
from rl_conductor.prompting import DEFAULT_MAX_QUESTION_CHARS, conductor_prompt, recursive_prompt
from rl_conductor.tasks.base import Task
from rl_conductor.trace import Limits, Trace
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import ParseError, Step, Workflow, parse, render

CONFIG_FILE = "conductor.json"
FALLBACK_INSTRUCTION = "Solve the problem step by step and give the final answer."


def model_source(spec: str | Path) -> Path | str:
    """Where to load a Conductor from, checked before any weights are read.

    A local folder holding ``conductor.json`` (or at least a model's ``config.json``) is returned
    as a ``Path``; ``s3://``, ``models:/`` and ``runs:/`` URIs are downloaded first (MLflow
    registry or object store); a Hugging Face id (``owner/name``, not a local path) is returned
    as is for ``from_pretrained``. Anything else raises :class:`~rl_conductor.errors.ModelNotFound`
    ("no Conductor model at PATH …") instead of a hub error about repo ids.
    """
    text = str(spec)
    if text.startswith(("s3://", "models:/", "runs:/")):
        from rl_conductor.tracking.registry import load_model_dir

        return Path(load_model_dir(text))
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / CONFIG_FILE).is_file() or (path / "config.json").is_file():
            return path
        raise model_not_found(text, f"{text} holds neither {CONFIG_FILE} nor config.json")
    if path.exists():
        raise model_not_found(text, f"{text} is a file, not a folder")
    from rl_conductor.training.models import looks_like_hf_id

    if looks_like_hf_id(text):
        return text
    raise model_not_found(text, "no such folder")


def fallback_workflow(view: PoolView, limits: Limits) -> Workflow:
    """One step on the highest-priced permitted worker (any worker if none is permitted)."""
    permitted = [j for j, i in enumerate(view.infos()) if limits.permits(i.name, i.hosting)] or list(
        range(len(view))
    )
    best = max(permitted, key=lambda j: (view.worker(j).info.price_out, -j))
    return Workflow(steps=(Step(best, FALLBACK_INSTRUCTION, ()),))


class ConductorPolicy(Policy):
    """A trained Conductor model (see module docstring)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        greedy: bool = True,
        retries: int = 2,
        retry_temperature: float = 0.7,
        max_new_tokens: int | None = None,
        batch_size: int = 32,
        seed: int = 0,
        device: str = "cpu",
    ) -> None:
        from rl_conductor.training.generate import load_lm

        source = model_source(model_dir)
        self.model_dir = Path(source)
        cfg_path = self.model_dir / CONFIG_FILE
        self.meta: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        try:
            self.model, self.tokenizer = load_lm(source, device=device)
        except OSError as exc:
            if isinstance(source, Path):
                raise
            # a hub id that the hub (or the offline cache) cannot serve
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise model_not_found(source, f"as a Hugging Face id it did not load: {first}") from exc
        self.greedy = greedy
        self.retries = retries
        self.retry_temperature = retry_temperature
        self.max_new_tokens = int(max_new_tokens or self.meta.get("max_completion_length", 256))
        self.max_question_chars = int(self.meta.get("max_question_chars", DEFAULT_MAX_QUESTION_CHARS))
        self.batch_size = batch_size
        self.seed = seed
        self.name = f"conductor:{self.model_dir.name}"
        self._lock = threading.Lock()  # generation is synchronous; guards the model across threads

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **kw: Any) -> ConductorPolicy:
        if not arg:
            raise InvalidSpec("conductor needs a model folder or URI: conductor:DIR")
        return cls(arg, seed=int(kw.get("seed", 0)))

    # -- generation -------------------------------------------------------------------------
    def _chat(self, prompt: str) -> str:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return str(text)

    def _generate(self, prompts: Sequence[str], *, greedy: bool, seed: int) -> list[str]:
        from rl_conductor.training.generate import generate

        return generate(
            self.model,
            self.tokenizer,
            [self._chat(p) for p in prompts],
            max_new_tokens=self.max_new_tokens,
            temperature=self.retry_temperature,
            greedy=greedy,
            seed=seed,
            batch_size=self.batch_size,
        )

    def _parse_all(
        self,
        prompts: list[str],
        views: list[PoolView],
        limits: list[Limits],
        *,
        allow_empty: bool = False,
        depth: int = 0,
    ) -> list[Plan]:
        """Generate for every prompt, retry the unparseable ones, fall back where retries fail."""
        plans: list[Plan | None] = [None] * len(prompts)
        errors: list[str] = [""] * len(prompts)
        todo = list(range(len(prompts)))
        for attempt in range(self.retries + 1):
            if not todo:
                break
            greedy = self.greedy and attempt == 0
            texts = self._generate([prompts[i] for i in todo], greedy=greedy, seed=self.seed + attempt)
            still = []
            for i, text in zip(todo, texts, strict=True):
                try:
                    wf = parse(
                        text,
                        pool_size=len(views[i]),
                        max_steps=limits[i].max_steps,
                        allow_recursion=limits[i].allows_recursion(depth),
                        allow_empty=allow_empty,
                    )
                    plans[i] = Plan(workflow=wf, text=text, parse_error=errors[i] or None)
                except ParseError as exc:
                    errors[i] = str(exc)
                    still.append(i)
            todo = still
        for i in todo:
            wf = fallback_workflow(views[i], limits[i])
            plans[i] = Plan(workflow=wf, text=render(wf), fallback=True, parse_error=errors[i])
        return [p for p in plans if p is not None]

    # -- Policy -----------------------------------------------------------------------------
    def prompt(self, task: Task, view: PoolView, limits: Limits) -> str:
        return conductor_prompt(task, view, limits, max_question_chars=self.max_question_chars)

    async def plan(self, task: Task, view: PoolView, limits: Limits) -> Plan:
        with self._lock:
            return self._parse_all([self.prompt(task, view, limits)], [view], [limits])[0]

    async def plan_many(self, tasks: Sequence[Task], view: PoolView, limits: Limits) -> list[Plan]:
        with self._lock:
            return self._parse_all(
                [self.prompt(t, view, limits) for t in tasks], [view] * len(tasks), [limits] * len(tasks)
            )

    def plan_batch(self, items: Sequence[tuple[Task, PoolView, Limits]]) -> list[Plan]:
        """Plan several requests, each with its own view and limits, in one batched generation.

        Synchronous and thread-safe (the serving micro-batcher calls it from a worker thread)."""
        with self._lock:
            return self._parse_all(
                [self.prompt(t, v, lim) for t, v, lim in items],
                [v for _, v, _ in items],
                [lim for _, _, lim in items],
            )

    async def run_many(self, tasks: Sequence[Task], view: PoolView, limits: Limits) -> list[Episode]:
        plans = await self.plan_many(tasks, view, limits)
        hook = self.recursion_hook(view)

        async def one(task: Task, plan: Plan) -> Episode:
            trace = await execute(plan.workflow, task, view, limits, recursion=hook)
            trace.workflow_text, trace.fallback_plan = plan.text, plan.fallback
            return Episode(plan=plan, trace=trace)

        return list(await asyncio.gather(*(one(t, p) for t, p in zip(tasks, plans, strict=True))))

    def recursion_hook(self, view: PoolView) -> Any:
        async def hook(req: RecursionRequest) -> Trace:
            prompt = recursive_prompt(
                req.task,
                view,
                req.limits,
                req.parent,
                req.answer_so_far,
                depth=req.depth,
                max_question_chars=self.max_question_chars,
            )
            with self._lock:
                plan = self._parse_all([prompt], [view], [req.limits], allow_empty=True, depth=req.depth)[0]
            if plan.fallback or not plan.workflow.steps:
                return Trace(task_id=req.task.id, final_answer=req.answer_so_far, workflow_text=plan.text)
            inner = await execute(plan.workflow, req.task, view, req.limits, recursion=hook, depth=req.depth)
            inner.workflow_text = plan.text
            return inner

        return hook
