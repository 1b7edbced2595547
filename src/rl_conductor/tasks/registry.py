"""The dataset registry and the splits: the mechanics every dataset module registers with.

Why a module of its own: the dataset modules (:mod:`rl_conductor.tasks.builtin`,
:mod:`rl_conductor.tasks.routellm`, :mod:`rl_conductor.tasks.gsm8k_six`) register here and load
one another's datasets through :func:`load_tasks`, and :mod:`rl_conductor.tasks.datasets` imports
them all; with the registry below them every import points one way (no circle, no import by
string). Callers import :func:`load_tasks` from :mod:`rl_conductor.tasks.datasets`, where every
dataset is registered.

Splits are not the datasets' native ones: every task falls into ``train`` / ``validation`` /
``test`` (70 / 10 / 20) by a SHA-256 hash of its id, so the split of a task never changes and is
the same in every dataset that contains it (``paper-mix`` included). A task whose
``metadata["split"]`` names a split is in that one instead (a recordings file's ``split`` field,
:func:`split_of_task`): every split consumer goes through :func:`load_tasks`, which reads it. A
name ``recordings:<path>`` loads the items of a bring-your-own recordings file
(:mod:`rl_conductor.tasks.recordings_format`).

Loaders return all rows at once (the largest set is a few thousand rows), cached for the
process; the cached Tasks share their ``metadata`` dicts, which callers must not mutate.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace

from rl_conductor.errors import UnknownName
from rl_conductor.tasks.base import DOMAINS, Task
from rl_conductor.tasks.recordings_format import CARVED_FROM, recordings_tasks
from rl_conductor.validation import DATA_SPLITS, SPLIT_CHOICES

log = logging.getLogger(__name__)
#: recordings datasets whose carved validation split was announced (once per process)
_CARVE_SAID: set[str] = set()
#: Upper bounds of the hash fraction for train and validation; the rest is test.
SPLIT_BOUNDS = (0.7, 0.8)
#: The share of a recordings file's training items that become its validation split where the
#: file names no validation item (``"split": "train"`` / ``"test"`` only): the share the default
#: split gives validation out of train and validation (10 of 80). See :func:`carve_validation`.
CARVED_VALIDATION = 0.125

Loader = Callable[[], list[Task]]
_REGISTRY: dict[str, Loader] = {}


class UnknownDatasetError(UnknownName):
    """Raised by :func:`load_tasks` for a name no loader is registered under."""


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    """Decorator: register ``fn() -> list[Task]`` (all rows, every split) under ``name``."""

    def deco(fn: Loader) -> Loader:
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != fn.__qualname__:
            raise ValueError(f"dataset {name!r} is already registered by {existing.__module__}")
        _REGISTRY[name] = fn
        _load_all.cache_clear()
        return fn

    return deco


def unregister_dataset(name: str) -> None:
    """Forget the loader registered under ``name`` (a plugin's, a test's scratch dataset); no-op
    for a name not registered."""
    _REGISTRY.pop(name, None)
    _load_all.cache_clear()


def available_datasets() -> list[str]:
    """Names accepted by :func:`load_tasks`, sorted."""
    return sorted(_REGISTRY)


def hash_fraction(key: str) -> float:
    """A number in [0, 1) from a SHA-256 hash of ``key``: the split of an id, a salted order."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:12], 16) / float(1 << 48)


def split_of(task_id: str) -> str:
    """``train`` / ``validation`` / ``test``, from a SHA-256 hash of the task id (70/10/20)."""
    h = hash_fraction(task_id)
    if h < SPLIT_BOUNDS[0]:
        return "train"
    if h < SPLIT_BOUNDS[1]:
        return "validation"
    return "test"


def split_of_task(task: Task) -> str:
    """The split of ``task``: its ``metadata["split"]`` when it states one, else :func:`split_of`."""
    stated = task.metadata.get("split")
    return stated if stated in DATA_SPLITS else split_of(task.id)


@functools.cache
def _load_all(name: str) -> tuple[Task, ...]:
    tasks = tuple(_REGISTRY[name]())
    ids = Counter(t.id for t in tasks)
    dups = [i for i, n in ids.items() if n > 1]
    if dups:
        raise ValueError(f"dataset {name!r} has duplicate task ids, e.g. {dups[:3]}")
    return tasks


def load_tasks(name: str, split: str = "all", *, limit: int | None = None, seed: int = 0) -> list[Task]:
    """Tasks of dataset ``name`` in ``split``, in the dataset's order.

    Args:
        name: a registered dataset (see :func:`available_datasets`).
        split: ``"train"``, ``"validation"``, ``"test"`` or ``"all"``.
        limit: keep at most this many, a random sample drawn with ``seed`` (order preserved).
        seed: seed of that sample; ignored without ``limit``.
    """
    if split not in SPLIT_CHOICES:
        raise UnknownName(f"unknown split {split!r}; expected one of {', '.join(SPLIT_CHOICES)}")
    if name not in _REGISTRY and name.startswith("recordings:"):  # a bring-your-own recordings file
        return _select(carve_validation(recordings_tasks(name), name), split, limit, seed)
    if name not in _REGISTRY:
        raise UnknownDatasetError(f"unknown dataset {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    return _select(list(_load_all(name)), split, limit, seed)


#: unlabelled items the id hash puts in validation, from which a file that states other splits
#: keeps them as its validation split and carves none from its training items
ENOUGH_HASHED_VALIDATION = 50


def carve_validation(tasks: list[Task], name: str) -> list[Task]:
    """``tasks`` of a recordings file, with a validation split where the file names none.

    Why: a team's file often says only which items are train and which test (a 70/30 split, as
    issue 21's eleven-model file was). ``--preset auto`` chooses on validation items and a
    choice on training or test items is biased, so such a file had been refused. Now
    :data:`CARVED_VALIDATION` of its training items (by a salted hash of the id, so every
    command of every run sees the same ones) are its validation split, and the test items are
    untouched; a warning says so once per file. The carved items leave the training split, so a
    model never trains on the items it is chosen on. A file that names any validation item, or
    states no split at all and has validation items by the id hash, is as written. The original
    field is kept (``metadata[CARVED_FROM]``) so that writing the file back writes what it said."""
    stated = {t.metadata.get("split") for t in tasks} & set(DATA_SPLITS)
    if not tasks or "validation" in stated:
        return tasks
    # a file that states splits but names no validation item is carved even where a few unlabelled
    # items hash into validation (two such items had left a validation split of one question);
    # a file that states none has the hash's 70/10/20, carved only where that gives no validation
    hashed = sum(split_of_task(t) == "validation" for t in tasks)
    if not stated and hashed:
        return tasks
    # a file that states splits for some items only (its test items, say) and leaves the rest to
    # the hash already has a validation split of its own size: carving more made it 52 % of the
    # training items on an outside tester's file (H39), and the warning named only the carved part
    if hashed >= ENOUGH_HASHED_VALIDATION:
        return tasks
    out, carved = [], 0
    for t in tasks:
        if split_of_task(t) == "train" and hash_fraction(f"validation-from-train:{t.id}") < CARVED_VALIDATION:
            t = replace(
                t, metadata={**t.metadata, "split": "validation", CARVED_FROM: t.metadata.get("split")}
            )
            carved += 1
        out.append(t)
    if carved and name not in _CARVE_SAID:
        _CARVE_SAID.add(name)
        log.warning(
            "%s names no validation item: %d of its %d training items (about %.1f %%, by a hash of the id) "
            "are its validation split%s, where --preset auto chooses and eval --split validation "
            'reads; give items "split": "validation" to choose them yourself',
            name,
            carved,
            sum(split_of_task(t) == "train" for t in tasks),
            100 * CARVED_VALIDATION,
            f" with {hashed} unlabelled items the hash put there ({carved + hashed} in all)"
            if hashed
            else "",
        )
    return out


def _select(all_tasks: list[Task], split: str, limit: int | None, seed: int) -> list[Task]:
    tasks = [t for t in all_tasks if split == "all" or split_of_task(t) == split]
    if limit is not None and limit < len(tasks):
        keep = sorted(random.Random(seed).sample(range(len(tasks)), max(limit, 0)))
        tasks = [tasks[i] for i in keep]
    return tasks


def split_counts(name: str) -> str:
    """``train N, validation N, test N`` of dataset ``name``: what the errors about an empty split
    show (an evaluation's, a router's fit, training), so the user sees where the items went."""
    counts = Counter(split_of_task(t) for t in load_tasks(name, split="all"))
    return ", ".join(f"{s} {counts.get(s, 0)}" for s in DATA_SPLITS)


def domain_counts(tasks: Iterable[Task]) -> dict[str, int]:
    """Number of tasks per domain, known domains first in ``DOMAINS`` order."""
    counts = Counter(t.domain for t in tasks)
    order = [d for d in DOMAINS if d in counts] + sorted(d for d in counts if d not in DOMAINS)
    return {d: counts[d] for d in order}
