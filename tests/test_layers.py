"""The package's layers, as ampteach/README.md states them, checked from the source.

Every import statement of every module counts, the ones inside functions too (a lazy import is still
a dependency, and a cycle hidden by one is still a cycle). The rule: a sub-package imports only the
ones to its left in LAYERS, or itself; ampteach.amp imports torch and the standard library only; no
module imports the top-level `ampteach` facade; the module graph has no cycle; no module is longer
than a sitting.
"""

from __future__ import annotations

import ast
import sys
import warnings
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "ampteach"
LAYERS = ("amp", "training", "lab", "grading", "tools")   # each may import the ones before it
MAX_LINES = 500
AMP_THIRD_PARTY = {"torch"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the module, resolved to the deepest module that exists."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return imports_in(ast.parse(path.read_text(), str(path)), package)


def imports_in(tree: ast.AST, package: str) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):  # every node: imports inside functions count
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:  # `from pkg import module` imports the module
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in MODULES else target, node.lineno))
    return found


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "ampteach" and parts[1] in LAYERS else None


def graph() -> dict[str, set[str]]:
    return {name: {target for target, _ in imports_of(name) if target in MODULES and target != name}
            for name in MODULES}


def test_every_module_belongs_to_a_layer_or_is_the_facade():
    top = {name for name in MODULES if layer_of(name) is None}
    assert top == {"ampteach", "ampteach.__main__", "ampteach._moved"}, (
        f"modules outside the layers: {sorted(top - {'ampteach', 'ampteach.__main__', 'ampteach._moved'})}; "
        f"put each in one of ampteach/{{{','.join(LAYERS)}}}/ (see ampteach/README.md)")


def test_layers_depend_one_way():
    wrong = []
    for name in MODULES:
        mine = layer_of(name)
        if mine is None:
            continue
        for target, line in imports_of(name):
            if target == "ampteach":
                wrong.append(f"{name}:{line} imports the top-level ampteach facade (it imports every layer)")
                continue
            theirs = layer_of(target)
            if theirs is not None and LAYERS.index(theirs) > LAYERS.index(mine):
                wrong.append(f"{name}:{line} ({mine}) imports {target} ({theirs})")
    assert not wrong, "dependencies must run toward ampteach.amp:\n" + "\n".join(wrong)


def test_the_amp_rebuild_imports_torch_only():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    wrong = []
    for name in MODULES:
        if layer_of(name) != "amp":
            continue
        for target, line in imports_of(name):
            top = target.split(".")[0]
            if top == "ampteach":
                if layer_of(target) != "amp":
                    wrong.append(f"{name}:{line} imports {target}")
            elif top not in stdlib and top not in AMP_THIRD_PARTY:
                wrong.append(f"{name}:{line} imports {target}")
    assert not wrong, "ampteach.amp is the drop-in rebuild of torch.amp: torch and the standard library only\n" + \
        "\n".join(wrong)


def test_the_learners_side_of_grading_never_imports_the_judges_side():
    """ampteach.grading.checks runs in the learner's kernel and in the grading sandbox: it must not import the judges
    (reference answers, hidden cases), nor the grader (grade, autograde, the sandbox, the exports), which hold them
    or run them. The judges may import the learner's side (its plans and watches); never the other way."""
    wrong = []
    for name in MODULES:
        if not name.startswith("ampteach.grading.checks"):
            continue
        for target, line in imports_of(name):
            if target.startswith("ampteach.grading") and not target.startswith("ampteach.grading.checks") \
                    and target != "ampteach.grading":
                wrong.append(f"{name}:{line} imports {target}")
    assert not wrong, "the learner's side imports the grader's side:\n" + "\n".join(wrong)


def test_the_judges_are_hidden_from_the_grading_sandbox():
    from ampteach.grading.sandbox import hidden_folders

    assert str(PACKAGE / "grading" / "judges") in [str(Path(f)) for f in hidden_folders()]


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle a depth-first search meets, as [a, b, ..., a]."""
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    return cycles


def test_no_import_cycles_lazy_imports_included():
    cycles = find_cycles(graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_a_cycle_made_by_a_lazy_import():
    """The check itself: an import inside a function is an edge, and a two-module loop is a cycle."""
    lazy = ast.parse("def f():\n    from ampteach.lab import plots\n")
    assert imports_in(lazy, "ampteach.lab") == [("ampteach.lab.plots", 2)]
    assert find_cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_longer_than_a_sitting(name):
    lines = len(MODULES[name].read_text().splitlines())
    where = MODULES[name].relative_to(PACKAGE.parent)
    assert lines <= MAX_LINES, (f"{where} has {lines} lines (at most {MAX_LINES}): split it along a seam, "
                                f"the readable contract first and the machinery beside it")


def test_the_layout_is_written_down():
    readme = (PACKAGE / "README.md").read_text()
    for layer in LAYERS:
        assert f"\n  {layer}/" in readme, f"ampteach/README.md's tree does not describe ampteach/{layer}/"
        doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text()))
        assert doc, f"ampteach/{layer}/__init__.py has no docstring saying what lives there"


def test_old_module_paths_still_import_with_a_warning():
    """Decision: notebooks started before the split (`from ampteach.checks import ...`) keep working."""
    import importlib

    import ampteach  # noqa: F401  (installs the finder)
    from ampteach._moved import MOVED, SHADOWED

    for old, new in MOVED.items():
        if old in SHADOWED:
            with pytest.raises(ImportError, match=f"ampteach.{new}"):
                importlib.import_module(f"ampteach.{old}")
            continue
        sys.modules.pop(f"ampteach.{old}", None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(f"ampteach.{old}")
        assert module is importlib.import_module(f"ampteach.{new}"), old
        assert module.__spec__.name == f"ampteach.{new}", "the real module's spec must survive the alias"
        assert any(f"ampteach.{new}" in str(w.message) for w in caught), f"no warning naming the new path for {old}"
    import ampteach.checks.common as old_common
    from ampteach.grading.checks import common

    assert old_common is common
    assert callable(ampteach.autocast) and isinstance(ampteach.train, type(lambda: 0))
