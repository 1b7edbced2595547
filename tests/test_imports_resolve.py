"""Every ``from rl_conductor… import name`` in the scripts, components and tests names something
that exists, function-level imports included: ruff and the layer contract read only whether a
module imports another, so a rename broke ``benchmarks/observed_drift.py`` unnoticed until a
reader ran it. Read from the source files (no module is imported: the suite's time stays that
of parsing)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
FOLDERS = ("benchmarks", "components", "pipelines", "serving", "tests", "src/rl_conductor")


def _file_of(module: str) -> Path | None:
    base = SRC.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


@cache
def _defined(module: str) -> frozenset[str]:
    """The names ``module`` binds at its top level (under ``if`` / ``try`` blocks too)."""
    path = _file_of(module)
    assert path is not None, module
    names: set[str] = set()
    todo: list[ast.stmt] = list(_tree(path).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.If):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return frozenset(names)


def _imports() -> list[tuple[str, int, str, str]]:
    out = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(_tree(path)):
                ours = isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                if ours and (node.module == "rl_conductor" or node.module.startswith("rl_conductor.")):
                    rel = path.relative_to(ROOT).as_posix()
                    out += [(rel, node.lineno, node.module, a.name) for a in node.names]
    return out


def test_every_imported_rl_conductor_name_exists() -> None:
    imports = _imports()
    assert len(imports) > 500 and any(f.startswith("benchmarks/") for f, *_ in imports)
    missing = [
        f"{f}:{line}: {module} has no {name!r}"
        for f, line, module, name in imports
        if _file_of(module) is None
        or (name not in _defined(module) and _file_of(f"{module}.{name}") is None)
    ]  # fmt: skip
    assert not missing, "\n".join(missing)


def _runtime_imports(module: str) -> set[str]:
    """The modules ``module`` imports outside ``if TYPE_CHECKING:`` blocks, function level too."""
    path = _file_of(module)
    assert path is not None, module
    tree = _tree(path)
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for n in ast.walk(block)
    }
    out = set()
    for n in ast.walk(tree):
        if id(n) in typing_only:
            continue
        if isinstance(n, ast.ImportFrom) and n.module:
            out.add(n.module)
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
    return out


def test_a_module_loaded_by_name_never_imports_its_loader() -> None:
    """Dataset modules, worker kinds and policy kinds are imported by the catalog above them
    (``tasks.datasets``; ``workers.pool`` by name; ``policies.catalog`` by name): none of them
    imports that catalog back, which would be a circle the layer contract cannot see."""
    from rl_conductor.policies import catalog
    from rl_conductor.workers.pool import BUILTIN_KIND_MODULES

    datasets = ["rl_conductor.tasks." + m for m in ("builtin", "routellm", "gsm8k_six")]
    kinds = [*sorted(set(BUILTIN_KIND_MODULES.values())), "rl_conductor.workers.simulated.worker"]
    policies = sorted({v.partition(":")[0] for v in catalog.POLICY_KINDS.values()})
    loaded = {
        "rl_conductor.tasks.datasets": datasets,
        "rl_conductor.workers.pool": kinds,
        "rl_conductor.policies.catalog": policies,
    }
    for loader, modules in loaded.items():
        for module in modules:
            assert loader not in _runtime_imports(module), f"{module} imports {loader}, which loads it"
