"""Mutation testing of the core modules with a small AST mutator; writes JSON (not part of `make test`).

Why our own mutator: the tests must run against a mutated module without touching the shared
working tree (other runs import the real file at the same time), so each mutant is written to a
temporary file and a meta-path finder makes ``import rl_conductor.<module>`` load it inside a
fresh pytest process. The operators are the classic ones:

* comparison swaps (``<``/``<=``, ``>``/``>=``, ``==``/``!=``, ``in``/``not in``, ``is``/``is not``)
* arithmetic swaps (``+``/``-``, ``*``/``/``) and ``and``/``or``, ``min``/``max``
* constants (an int ``n`` becomes ``n + 1``, 1 becomes 0, a float ``x`` becomes ``2x``, ``True``/``False``)
* dropping ``not``, and deleting one statement of a function body (``x += y``, a call, an assignment)

Type annotations and docstrings are never mutated. A mutant is *killed* when its test file fails
(or passes its time limit); a *survivor* passed every test. Each run is deterministic: Hypothesis
is derandomised and keeps no example database. Survivors need a human verdict (an equivalent
mutant cannot be killed); record it in ``--verdicts`` (JSON: ``{"module:index": "equivalent: why"}``).

Usage::

    python benchmarks/mutation.py --module executor --tests tests/test_executor.py --sample 120
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_COMPARE_SWAPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_BINOP_SWAPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
}


@dataclass
class Site:
    """One place a mutation can be applied."""

    index: int
    line: int
    kind: str
    description: str


class _Mutator(ast.NodeTransformer):
    """Walks the tree in a fixed order; counts mutation sites, and applies the one at ``target``."""

    def __init__(self, target: int | None = None) -> None:
        self.target = target
        self.count = 0
        self.sites: list[Site] = []
        self.in_function = 0

    # -- bookkeeping -------------------------------------------------------------------------
    def _site(self, node: ast.AST, kind: str, description: str) -> bool:
        """Register a site; True when it is the one to mutate."""
        index = self.count
        self.count += 1
        self.sites.append(Site(index, getattr(node, "lineno", 0), kind, description))
        return index == self.target

    # -- skip annotations and docstrings -------------------------------------------------------
    def visit_arg(self, node: ast.arg) -> ast.arg:
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is not None:
            node.value = self.visit(node.value)
        return node

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for i, stmt in enumerate(body):
            docstring = i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            deletable = (
                self.in_function
                and not docstring
                and isinstance(stmt, ast.Assign | ast.AugAssign | ast.Expr)
                and not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))
            )
            if deletable and self._site(stmt, "delete", f"delete `{ast.unparse(stmt)[:80]}`"):
                out.append(ast.copy_location(ast.Pass(), stmt))
                continue
            out.append(self.visit(stmt))
        return out or [ast.Pass()]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        return self._function(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.args.defaults = [self.visit(d) for d in node.args.defaults]
        node.args.kw_defaults = [self.visit(d) if d is not None else None for d in node.args.kw_defaults]
        self.in_function += 1
        node.body = self._body(node.body)
        self.in_function -= 1
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.body = self._body(node.body)
        return node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("body", "orelse", "finalbody"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, field, self._body(value))
        for field, value in ast.iter_fields(node):
            if (
                field in ("body", "orelse", "finalbody")
                and isinstance(value, list)
                and value
                and isinstance(value[0], ast.stmt)
            ):
                continue
            if isinstance(value, list):
                new = []
                for item in value:
                    if isinstance(item, ast.AST):
                        item = self.visit(item)
                    new.append(item)
                setattr(node, field, new)
            elif isinstance(value, ast.AST):
                setattr(node, field, self.visit(value))
        return node

    # -- operators ----------------------------------------------------------------------------
    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        node = self.generic_visit(node)  # type: ignore[assignment]
        for i, op in enumerate(node.ops):
            swap = _COMPARE_SWAPS.get(type(op))
            if swap and self._site(node, "compare", f"{type(op).__name__} -> {swap.__name__}"):
                node.ops[i] = swap()
        return node

    def _swap_binop(self, node: ast.BinOp | ast.AugAssign, prefix: str) -> ast.AST:
        node = self.generic_visit(node)  # type: ignore[assignment]
        swap = _BINOP_SWAPS.get(type(node.op))
        if swap and self._site(node, "binop", f"{prefix}{type(node.op).__name__} -> {swap.__name__}"):
            node.op = swap()
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        return self._swap_binop(node, "")

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
        return self._swap_binop(node, "augmented ")

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        node = self.generic_visit(node)  # type: ignore[assignment]
        other = ast.Or if isinstance(node.op, ast.And) else ast.And
        if self._site(node, "boolop", f"{type(node.op).__name__} -> {other.__name__}"):
            node.op = other()
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        node = self.generic_visit(node)  # type: ignore[assignment]
        if isinstance(node.op, ast.Not) and self._site(node, "not", "drop `not`"):
            return node.operand
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("min", "max"):
            other = "max" if node.id == "min" else "min"
            if self._site(node, "call", f"{node.id} -> {other}"):
                return ast.copy_location(ast.Name(id=other, ctx=node.ctx), node)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        v = node.value
        if isinstance(v, bool):
            if self._site(node, "constant", f"{v} -> {not v}"):
                return ast.copy_location(ast.Constant(not v), node)
        elif isinstance(v, int):
            new = 0 if v == 1 else v + 1
            if self._site(node, "constant", f"{v} -> {new}"):
                return ast.copy_location(ast.Constant(new), node)
        elif isinstance(v, float):
            new_f = 1.0 if v == 0 else v * 2
            if self._site(node, "constant", f"{v!r} -> {new_f!r}"):
                return ast.copy_location(ast.Constant(new_f), node)
        return node


def sites(source: str) -> list[Site]:
    m = _Mutator()
    m.visit(ast.parse(source))
    return m.sites


def mutant_source(source: str, index: int) -> str:
    tree = ast.parse(source)
    m = _Mutator(target=index)
    tree = m.visit(copy.deepcopy(tree))
    ast.fix_missing_locations(tree)
    return ast.unparse(tree)


_BOOTSTRAP = """
import importlib.abc, importlib.util, sys
from hypothesis import settings
settings.register_profile("mutation", database=None, derandomize=True)
settings.load_profile("mutation")
NAME, PATH = sys.argv[1], sys.argv[2]
class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        return importlib.util.spec_from_file_location(fullname, PATH) if fullname == NAME else None
sys.meta_path.insert(0, _Finder())
import pytest
sys.exit(pytest.main(sys.argv[3:]))
"""


@dataclass
class Outcome:
    index: int
    line: int
    kind: str
    description: str
    killed: bool
    how: str
    seconds: float


def run_mutant(
    module: str, source: str, site: Site, tests: list[str], timeout: float, fast_k: str | None = None
) -> Outcome:
    """Run the tests on one mutant: the fast tests first (``-k fast_k``), then all of them."""
    t0 = time.perf_counter()
    stages = [[*tests, "-k", fast_k], tests] if fast_k else [tests]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{module.rsplit('.', 1)[-1]}.py"
        path.write_text(mutant_source(source, site.index))
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        for args in stages:
            cmd = [sys.executable, "-c", _BOOTSTRAP, module, str(path), "-x", "-q", "-p", "no:cacheprovider"]
            try:
                proc = subprocess.run(
                    [*cmd, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
                )
            except subprocess.TimeoutExpired:
                return Outcome(**_site(site), killed=True, how="timeout", seconds=time.perf_counter() - t0)
            if proc.returncode != 0:
                how = _failure(proc.stdout)
                return Outcome(**_site(site), killed=True, how=how, seconds=time.perf_counter() - t0)
    return Outcome(**_site(site), killed=False, how="survived", seconds=time.perf_counter() - t0)


def _site(site: Site) -> dict[str, object]:
    return {"index": site.index, "line": site.line, "kind": site.kind, "description": site.description}


def _failure(stdout: str) -> str:
    for line in stdout.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            return line[:200]
    return (stdout.strip().splitlines() or ["failed"])[-1][:200]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--module", required=True, help="module under rl_conductor, e.g. executor")
    ap.add_argument("--tests", nargs="+", required=True, help="pytest arguments (test files / -k)")
    ap.add_argument("--fast-k", help="pytest -k expression of the quick tests, run first on each mutant")
    ap.add_argument("--sample", type=int, default=0, help="mutants drawn at random (0 = all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", type=Path, help="mutate this copy of the module (e.g. a committed version)")
    ap.add_argument("--only", type=int, nargs="+", help="run just these site indices (re-checks)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per mutant (then: killed)")
    ap.add_argument("--verdicts", type=Path, help="JSON of human verdicts on survivors")
    ap.add_argument(
        "--out", type=Path, help="result JSON (default benchmarks/results/mutation_<module>.json)"
    )
    args = ap.parse_args()

    module = f"rl_conductor.{args.module}"
    path = ROOT / "src" / "rl_conductor" / f"{args.module.replace('.', '/')}.py"
    source = (args.source or path).read_text()
    all_sites = sites(source)
    chosen = all_sites
    if args.sample and args.sample < len(all_sites):
        chosen = sorted(random.Random(args.seed).sample(all_sites, args.sample), key=lambda s: s.index)
    if args.only:
        chosen = [s for s in all_sites if s.index in set(args.only)]
    verdicts: dict[str, str] = json.loads(args.verdicts.read_text()) if args.verdicts else {}
    out_path = args.out or ROOT / "benchmarks" / "results" / f"mutation_{args.module}.json"
    outcomes: list[Outcome] = []
    for n, site in enumerate(chosen, 1):
        out = run_mutant(module, source, site, args.tests, args.timeout, args.fast_k)
        outcomes.append(out)
        where = f"#{site.index} line {site.line} {site.description}"
        print(f"[{n}/{len(chosen)}] {where}: {out.how} ({out.seconds:.1f}s)", flush=True)
        # written after every mutant, so a run that is stopped early still leaves its results
        result = summarize(args, module, len(all_sites), len(chosen), outcomes, verdicts)
        out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("outcomes", "survivors")}, indent=2))


def summarize(
    args: argparse.Namespace,
    module: str,
    n_sites: int,
    n_chosen: int,
    outcomes: list[Outcome],
    verdicts: dict[str, str],
) -> dict[str, object]:
    survivors = [o for o in outcomes if not o.killed]
    equivalent = [
        o for o in survivors if verdicts.get(f"{args.module}:{o.index}", "").startswith("equivalent")
    ]
    live = len(outcomes) - len(equivalent)
    killed = len(outcomes) - len(survivors)
    return {
        "module": module,
        "tests": args.tests,
        "sites": n_sites,
        "planned": n_chosen,
        "mutants": len(outcomes),
        "killed": killed,
        "survived": len(survivors),
        "equivalent": len(equivalent),
        "score_all": killed / len(outcomes) if outcomes else 1.0,
        "score_non_equivalent": killed / live if live else 1.0,
        "seed": args.seed,
        "survivors": [
            {**asdict(o), "verdict": verdicts.get(f"{args.module}:{o.index}", "")} for o in survivors
        ],
        "outcomes": [asdict(o) for o in outcomes],
    }


if __name__ == "__main__":
    main()
