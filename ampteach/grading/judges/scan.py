"""Reading the notebook's code, outside its process: names a check refuses, and what no graded notebook may use.

    used = uses(learner.sources(), lambda name: name == "policy_of")   # [("cell [3]", "policy_of")]
    refuse_uses(learner, is_answer_key, because=BECAUSE)               # CheckFailed naming the cell
    hits = forbidden(sources)                                          # [("cell [5]", "threading", why)]

Under `ampteach grade` the sources are the notebook's cells as the file holds them (read by the grader,
which the notebook cannot change); in a learner's kernel they are the cells it ran (its In list).
Cells the course wrote, unchanged, are skipped (the exercise's metadata lists their fingerprints).

`forbidden` is the list no exercise needs and every way around the grader's watch uses: reaching a
name through a string (getattr with a computed name, __import__, importlib, eval, exec), walking
frames, objects or the garbage collector, threads and processes, switching torch's function or
dispatch modes off, or the grader's own machinery. A notebook that uses one fails every check with a
message naming the cell; honest work has no need of any of them.
"""

from __future__ import annotations

import ast
import hashlib
from typing import Callable, Iterable

from ampteach.grading.checks.common import CheckFailed

__all__ = ["names_in", "uses", "refuse_uses", "forbidden", "FORBIDDEN", "fingerprint", "calls_from"]

_WHY_STRINGS = "it reaches code through a string, where no reader (and no grader) can see what it calls"
_WHY_FRAMES = "it reads the running code's frames, objects or internals, where the grader's watch lives"
_WHY_THREADS = "a graded notebook runs in one process and one thread"
_WHY_MODES = "it switches off torch's function or dispatch modes, which the grader's watch uses"
_WHY_GRADER = "it reaches into the grader's own machinery"
FORBIDDEN: dict[str, str] = {
    **dict.fromkeys(("__import__", "importlib", "import_module", "exec", "eval", "compile", "__builtins__",
                     "builtins", "globals", "vars", "attrgetter", "methodcaller", "__getattribute__", "pickle",
                     "marshal", "copyreg", "dill", "cloudpickle", "FunctionType", "CodeType", "LambdaType"),
                    _WHY_STRINGS),
    **dict.fromkeys(("__dict__", "__closure__", "cell_contents", "__globals__", "__code__", "__subclasses__",
                     "__bases__", "__mro__", "_getframe", "currentframe", "f_back", "f_locals", "f_globals", "tb_frame",
                     "gi_frame", "getprofile", "setprofile", "gettrace", "settrace", "addaudithook", "gc", "ctypes",
                     "inspect", "__reduce__", "__reduce_ex__", "monitoring"), _WHY_FRAMES),
    **dict.fromkeys(("threading", "_thread", "multiprocessing", "concurrent", "subprocess", "signal", "pty",
                     "socket", "os.system", "os.fork", "posix_spawn"), _WHY_THREADS),
    **dict.fromkeys(("DisableTorchFunction", "DisableTorchFunctionSubclass", "_DisableTorchDispatch",
                     "_disabled_torch_function_impl", "_set_torch_function_mode", "_set_torch_dispatch_mode",
                     "_ExcludeDispatchKeyGuard", "_IncludeDispatchKeyGuard", "_unset_dispatch_mode"), _WHY_MODES),
    **dict.fromkeys(("PROFILER", "Borrowed", "watches", "guard", "driver", "wire", "judges", "run_judge", "WATCHES",
                     "PLANS", "_serves_torch", "trusted_callers"), _WHY_GRADER),
}
FORBIDDEN_PREFIXES = {"_pop_": _WHY_MODES, "_push_on_": _WHY_MODES}
BUILTINS_ONLY = {"exec", "eval", "compile", "globals", "vars"}   # as methods (model.eval(), torch.compile): fine


def fingerprint(source: str) -> str:
    """A cell's fingerprint: the sha256 of its code, whitespace at the ends of lines ignored."""
    text = "\n".join(line.rstrip() for line in source.strip().splitlines())
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _parse(cell: str) -> ast.AST | None:
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        cell = TransformerManager().transform_cell(cell)   # %magics and !shell lines become Python
    except ImportError:
        pass
    try:
        return ast.parse(cell)
    except SyntaxError:
        return None


def names_in(tree: ast.AST) -> set[str]:
    """Every name the code uses: variables, attributes, imported modules and their parts (comments excluded)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module = getattr(node, "module", None) or ""
            found.update(module.split("."))
            for alias in node.names:
                found.update(alias.name.split("."))
    return found


def uses(sources: Iterable[tuple[str, str]], wanted: Callable[[str], bool]) -> list[tuple[str, str]]:
    """(cell label, name) for each name in the given cells that `wanted` picks."""
    found = []
    for label, cell in sources:
        tree = _parse(cell) if cell.strip() else None
        if tree is not None:
            found += [(label, name) for name in sorted(names_in(tree)) if wanted(name)]
    return found


def refuse_uses(learner, wanted: Callable[[str], bool], because: str) -> None:
    """CheckFailed if the learner's cells use a name `wanted` picks (an answer read before the check ran)."""
    used = uses(learner.sources(), wanted)
    if used:
        cells = ", ".join(f"`{name}` in {label}" for label, name in used)
        raise CheckFailed(f"your notebook used {cells}: {because}. Take that code out, restart the kernel and run "
                          f"the notebook in order")


def _dynamic_attribute(node: ast.AST) -> str | None:
    """getattr / setattr / delattr / hasattr with a name that is not written out, or passed on as a value."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
            node.func.id in ("getattr", "setattr", "delattr", "hasattr"):
        if len(node.args) < 2 or not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            return node.func.id
    return None


def forbidden(sources: Iterable[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(cell label, what, why) for each use of something no graded notebook may use (see the module docstring)."""
    hits = []
    for label, cell in sources:
        tree = _parse(cell) if cell.strip() else None
        if tree is None:
            continue
        called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Name) and node.id in ("getattr", "setattr", "delattr", "hasattr") and \
                    id(node) not in called:
                hits.append((label, node.id, _WHY_STRINGS))
            dynamic = _dynamic_attribute(node)
            if dynamic:
                hits.append((label, f"{dynamic} with a computed name", _WHY_STRINGS))
            if isinstance(node, ast.Attribute) and node.attr == "modules" and id(node) not in called:
                hits.append((label, "sys.modules", _WHY_STRINGS))
            if isinstance(node, ast.Name):
                name = node.id
            elif isinstance(node, ast.Attribute):
                name = node.attr if node.attr not in BUILTINS_ONLY else None
                if isinstance(node.value, ast.Name) and f"{node.value.id}.{node.attr}" in FORBIDDEN:
                    name = f"{node.value.id}.{node.attr}"
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                parts = (getattr(node, "module", None) or "").split(".")
                parts += [p for alias in node.names for p in alias.name.split(".")]
                hits += [(label, p, FORBIDDEN[p]) for p in parts if p in FORBIDDEN]
            if name is not None:
                if name in FORBIDDEN:
                    hits.append((label, name, FORBIDDEN[name]))
                for prefix, why in FORBIDDEN_PREFIXES.items():
                    if name.startswith(prefix):
                        hits.append((label, name, why))
    return list(dict.fromkeys(hits))


def calls_from(sources: Iterable[tuple[str, str]], function: str, depth: int = 2) -> set[str]:
    """The names the notebook function `function` calls (f(...) or x.f(...)), with those of the notebook functions
    it calls, `depth` levels down: what it runs, not merely what it mentions."""
    defs: dict[str, ast.FunctionDef] = {}
    for _, cell in sources:
        tree = _parse(cell) if cell.strip() else None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs[node.name] = node
    called: set[str] = set()
    todo, seen = [(function, depth)], set()
    while todo:
        name, level = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        for node in ast.walk(defs[name]):
            if isinstance(node, ast.Call):
                target = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if target:
                    called.add(target)
                    if level and target in defs:
                        todo.append((target, level - 1))
    return called
