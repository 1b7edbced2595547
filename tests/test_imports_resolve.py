"""Every ``from rl_conductor… import name`` in the scripts, components and tests names something
that exists, function-level imports included: ruff and the layer contract read only whether a
module imports another, so a rename broke ``benchmarks/observed_drift.py`` unnoticed until a
reader ran it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("benchmarks", "components", "pipelines", "serving", "tests", "src/rl_conductor")


def _imports() -> list[tuple[str, int, str, str]]:
    out = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                ours = isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                if ours and (node.module == "rl_conductor" or node.module.startswith("rl_conductor.")):
                    rel = path.relative_to(ROOT).as_posix()
                    out += [(rel, node.lineno, node.module, a.name) for a in node.names]
    return out


IMPORTS = _imports()


def test_the_scan_sees_the_function_level_imports() -> None:
    assert len(IMPORTS) > 500
    assert any(f.startswith("benchmarks/") for f, *_ in IMPORTS)


@pytest.mark.parametrize("module", sorted({m for _, _, m, _ in IMPORTS}))
def test_every_imported_name_exists(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [
        f"{f}:{line} imports {name!r}"
        for f, line, m, name in IMPORTS
        if m == module and name != "*" and not hasattr(mod, name)
        and not _is_submodule(module, name)
    ]  # fmt: skip
    assert not missing, f"{module} has no: " + "; ".join(missing)


def _is_submodule(module: str, name: str) -> bool:
    try:
        importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        return False
    return True


def _runtime_imports(module: str) -> set[str]:
    """The modules ``module`` imports outside ``if TYPE_CHECKING:`` blocks, function level too."""
    import inspect

    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
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
