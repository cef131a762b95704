"""Guards that keep the package readable: short functions, few parameters, no import cycles,
short commit subjects.

The functions listed in LONG and WIDE predate the guards; each may shrink, none may grow,
and no other function may join them. Remove an entry once its function is within the limit
(the test says which).
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path
from typing import Callable

import ckpt_cli

PACKAGE = Path(ckpt_cli.__file__).parent


def _flagged(lines_of: Callable[[str], list[int]]) -> list[str]:
    """"module:line" for every line ``lines_of`` flags in a module's text, over the package."""
    return [f"{path.relative_to(PACKAGE).as_posix()}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
            for line in lines_of(path.read_text())]
MAX_LINES = 60  # of a function's body, its docstring aside
MAX_PARAMS = 8  # an options dataclass counts as one
MAX_SUBJECT = 72
GUARDED_SINCE = "2373cb7"  # commit subjects are held to MAX_SUBJECT from the commit after this one

LONG = {
}
WIDE = {
}


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{rel}:{node.name}", node


def _body_lines(node: ast.FunctionDef) -> int:
    body = node.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return node.end_lineno - body[0].lineno + 1


def _params(node: ast.FunctionDef) -> int:
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def _over(measure, limit: int, known: dict[str, int]) -> list[str]:
    found = {name: measure(node) for name, node in _functions()}
    problems = [f"{name}: {n} (limit {limit})" for name, n in found.items()
                if n > limit and n > known.get(name, limit)]
    problems += [f"{name}: now {found.get(name, 0)}, within the limit: remove it from the list"
                 for name in known if found.get(name, 0) <= limit]
    return problems


def test_no_function_is_longer_than_the_limit():
    assert _over(_body_lines, MAX_LINES, LONG) == []


def test_no_function_takes_more_parameters_than_the_limit():
    assert _over(_params, MAX_PARAMS, WIDE) == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, (ast.Name, ast.Attribute)) and "TYPE_CHECKING" in ast.unparse(node.test)


def _runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """The ckpt_cli modules ``path`` imports when it runs (function-level imports too;
    TYPE_CHECKING blocks aside)."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            return
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("ckpt_cli")):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.update(f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("ckpt_cli"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in found if m in modules and m != me}


# What a command's run holds: set when the run value is built, never on it afterwards.
RUN_FIELDS = frozenset({"analysis", "planned", "result", "written", "check", "figures", "report"})
RUN_LAYERS = ("cli", "planning", "report", "verify")  # with api.py: where run values are built and read


def _run_patches(tree: ast.AST) -> list[int]:
    """Lines that set a run field on a built value (``out.check = ...``): on ``self``
    (its own constructor) and on the exception an ``except ... as e`` caught (the report
    of what was done before it) it is allowed."""
    caught = {h.name for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.name}
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        lines += [node.lineno for t in targets
                  if isinstance(t, ast.Attribute) and t.attr in RUN_FIELDS
                  and not (isinstance(t.value, ast.Name) and t.value.id in {"self", *caught})]
    return lines


def test_no_run_value_is_patched_after_it_is_built():
    """A command's run value (``api.RewriteRun``, ...) and its result are built once, whole:
    a later stage's figures go into a new value, never ``out.check = ...`` on a built one."""
    paths = [PACKAGE / "api.py", *(p for layer in RUN_LAYERS for p in sorted((PACKAGE / layer).rglob("*.py")))]
    found = [f"{path.relative_to(PACKAGE).as_posix()}:{line}" for path in paths
             for line in _run_patches(ast.parse(path.read_text(), str(path)))]
    assert found == []


def test_the_run_guard_sees_patches():
    code = ("out.check = 1\nrun.report = {}\nself.result = 2\nx.other = 3\n"
            "try:\n    pass\nexcept E as e:\n    e.report = {}\n")
    assert _run_patches(ast.parse(code)) == [1, 2]


def _all_imports(path: Path, package: str) -> set[str]:
    """The modules of ``package`` that ``path`` imports anywhere: at module or function
    level, or for type hints only (``TYPE_CHECKING``)."""
    base = _module_name(path).rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                parts = base.split(".")[:len(base.split(".")) - node.level + 1]
                source = ".".join(parts + ([node.module] if node.module else []))
            names = [source] + [f"{source}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out |= {n for n in names if n.startswith(package + ".")}
    return out


def test_verify_modules_form_no_circle_even_through_type_hints():
    """``verify``'s records, rules and stage read one way: the stage measures and calls the
    rules, the rules read the records; no import back, not even for a type hint."""
    folder = PACKAGE / "verify"
    paths = {_module_name(p): p for p in folder.glob("*.py") if p.name != "__init__.py"}
    graph = {m: _all_imports(p, "ckpt_cli.verify") & set(paths) for m, p in paths.items()}
    assert "ckpt_cli.verify.figures" in graph["ckpt_cli.verify.rules"]  # the reading sees imports
    assert _cycle(graph) is None


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_no_import_cycle_between_modules():
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: _runtime_imports(p, set(paths)) for m, p in paths.items()}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the search can find one
    assert graph["ckpt_cli.cli.main"] >= {"ckpt_cli.cli.commands"}
    assert _cycle(graph) is None


def test_commit_subjects_are_short():
    root = PACKAGE.parent
    known = subprocess.run(["git", "cat-file", "-e", f"{GUARDED_SINCE}^{{commit}}"], cwd=root, capture_output=True)
    span = [f"{GUARDED_SINCE}..HEAD"] if known.returncode == 0 else ["-1"]
    log = subprocess.run(["git", "log", "--format=%s", *span], cwd=root, capture_output=True, text=True, check=True)
    long = [s for s in log.stdout.splitlines() if len(s) > MAX_SUBJECT]
    assert long == []


MAX_COMMAND_LINES = 30  # a command parses, calls the API and renders


def test_every_cli_command_body_is_short():
    long = []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            commands = [d for d in getattr(node, "decorator_list", []) if "command" in ast.unparse(d)]
            if isinstance(node, ast.FunctionDef) and commands and _body_lines(node) > MAX_COMMAND_LINES:
                long.append(f"{path.name}:{node.name}: {_body_lines(node)}")
    assert long == []


def test_the_api_uses_no_private_name_of_another_module():
    tree = ast.parse((PACKAGE / "api.py").read_text())
    private = [f"{node.module}.{a.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert private == []


# A value's facts are fields computed when it is built, or functions a caller computes and
# keeps: a ``cached_property`` (which writes the instance's ``__dict__``), a ``_memo`` of
# results and a write into ``__dict__`` hide state from its type, its readers and mypy.
HIDDEN_CACHE = re.compile(r"__dict__|\bcached_property\b|\b_memo\b")


def _hidden_caches(text: str) -> list[int]:
    return [k for k, line in enumerate(text.splitlines(), 1) if HIDDEN_CACHE.search(line)]


def test_no_value_caches_its_facts_out_of_sight():
    found = _flagged(_hidden_caches)
    assert found == []


def test_the_cache_guard_sees_hidden_caches():
    text = ("@cached_property\ndef f(self): ...\nx.__dict__['a'] = 1\nself._memo.arenas[k] = v\n"
            "memo = {}\nself.memo[k] = v\nfrom functools import cached_property\n")
    assert _hidden_caches(text) == [1, 3, 4, 7]


def test_no_test_imports_bench():
    """The tests build and measure with tests/fixtures/ (bench/ imports from there), so they
    run from a tree without bench/. A test named ``test_bench_*`` tests a bench module itself
    and may import it."""
    tests = PACKAGE.parent / "tests"
    found = []
    for path in sorted(tests.rglob("*.py")):
        if path.name.startswith("test_bench_"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.relative_to(tests).as_posix()}:{node.lineno}" for n in names
                      if n.split(".")[0] == "bench"]
    assert found == []


def _names_a_report(node: ast.expr) -> bool:
    """``report``, ``*_report`` or ``x.report``: a report already built by its builder."""
    return (isinstance(node, ast.Name) and node.id.endswith("report")) or \
        (isinstance(node, ast.Attribute) and node.attr == "report")


MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"})


def _report_writes(tree: ast.AST) -> list[int]:
    """Lines that assign or delete into a built report, or call a dict mutator on one."""
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        lines += [node.lineno for t in targets if isinstance(t, ast.Subscript) and _names_a_report(t.value)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                and _names_a_report(node.func.value):
            lines.append(node.lineno)
    return lines


def test_no_assignment_into_a_report_after_it_is_built():
    """A report is built once, by its builder, from the run's values: a later stage that
    wants another section builds a new dict (``{**report, "check": ...}``), so the builder's
    output is the whole truth of what it was given."""
    found = _flagged(lambda text: _report_writes(ast.parse(text)))
    assert found == []


def test_the_report_guard_sees_writes():
    code = "report['a'] = 1\nout.report['b'] = 2\nreport.update(c=3)\ndel plan_report['d']\nr['e'] = 4\n"
    assert sorted(_report_writes(ast.parse(code))) == [1, 2, 3, 4]


def _drops_cause(node: ast.Raise, lines: list[str]) -> bool:
    """No ``from``, or ``from None`` without a comment on its line saying why the cause is hidden."""
    if node.cause is None:
        return True
    hidden = isinstance(node.cause, ast.Constant) and node.cause.value is None
    return hidden and "#" not in lines[node.cause.end_lineno - 1][node.cause.end_col_offset:]


def _unchained_raises(text: str) -> list[int]:
    """Lines that raise a new exception inside an ``except`` block without chaining a cause
    (``from e``): no ``from``, or ``from None`` (which drops the cause) without a comment
    on its line saying why. Re-raising the caught name itself is fine. A function defined
    in the handler is its own scope."""
    lines: list[int] = []
    source = text.splitlines()

    def visit(node: ast.AST, caught: tuple[str, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            caught = ()
        if isinstance(node, ast.Raise) and caught and node.exc is not None and _drops_cause(node, source) \
                and not (isinstance(node.exc, ast.Name) and node.exc.id in caught):
            lines.append(node.lineno)
        if isinstance(node, ast.ExceptHandler):
            caught = (*caught, node.name or "")  # "": a handler that names nothing it caught
        for child in ast.iter_child_nodes(node):
            visit(child, caught)

    visit(ast.parse(text), ())
    return lines


def test_every_raise_in_an_except_block_chains_its_cause():
    """An error raised while handling another names it as its cause (``raise X(...) from e``):
    the traceback under --debug shows what ckpt's one-line message was made from. Hiding it
    (``from None``) says why on its line."""
    found = _flagged(_unchained_raises)
    assert found == []


def test_the_cause_guard_sees_unchained_raises():
    code = ("try:\n    f()\nexcept OSError as e:\n    raise ValueError(e)\n"          # 4: unchained
            "try:\n    f()\nexcept OSError as e:\n    raise ValueError(e) from e\n"   # chained
            "try:\n    f()\nexcept OSError as e:\n    raise ValueError(e) from None\n"  # 12: dropped
            "try:\n    f()\nexcept OSError as e:\n    raise e\n"                      # the caught one
            "try:\n    f()\nexcept OSError as e:\n    if e.errno:\n        raise KeyError\n"  # 21: nested
            "try:\n    f()\nexcept OSError as e:\n    def g():\n        raise KeyError\n"  # own scope
            "try:\n    f()\nexcept OSError:\n    raise KeyError\n"                     # 30: unnamed handler
            "try:\n    f()\nexcept OSError:\n    raise KeyError from None\n"           # 34: unnamed, dropped
            "try:\n    f()\nexcept OSError:\n    raise KeyError from None  # why\n"    # hidden, says why
            "try:\n    f()\nexcept OSError:\n    raise KeyError(\n        'x') from None  # why\n"
            "try:\n    f()\nexcept OSError:\n    raise\n"                              # re-raised as it is
            "raise KeyError\n")                                                           # outside a handler
    assert _unchained_raises(code) == [4, 12, 21, 30, 34]


ISSUE_REFERENCE = re.compile(r"\bissue\s+#?\d+", re.IGNORECASE)


def _issue_references(text: str) -> list[int]:
    return [k for k, line in enumerate(text.splitlines(), 1) if ISSUE_REFERENCE.search(line)]


def test_no_issue_number_in_the_package():
    """The code says why in its own words: an "issue N" points at a tracker a reader of the
    package may not have (an upstream bug is cited by its address)."""
    found = _flagged(_issue_references)
    assert found == []


def test_the_issue_guard_sees_references():
    text = "x = 1  # issue 14\n\"\"\"see Issue #7\"\"\"\n# github.com/o/r/issues/3\n# an issue 'x'\n"
    assert _issue_references(text) == [1, 2]


NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)")
NOQA_WITH_REASON = re.compile(r":\s*[A-Z]+[0-9]+(?:,\s*[A-Z]+[0-9]+)*\s+-\s+\S")


def _bare_noqa(text: str) -> list[int]:
    return [k for k, line in enumerate(text.splitlines(), 1)
            if (m := NOQA.search(line)) and not NOQA_WITH_REASON.match(m["rest"])]


def test_every_noqa_names_its_rule_and_says_why():
    """``# noqa: CODE - why``: a silenced rule is named, and the line says why it does not apply."""
    found = _flagged(_bare_noqa)
    assert found == []


def test_the_noqa_guard_sees_bare_markers():
    text = "a  # noqa\nb  # noqa: E731\nc  # noqa: BLE001 - ORT's errors have no common type\nd  # noqa:E1,F2 - x\n"
    assert _bare_noqa(text) == [1, 2]


def _strict_modules(pyproject: str) -> set[str]:
    import tomllib

    overrides = tomllib.loads(pyproject)["tool"]["mypy"]["overrides"]
    return {m for o in overrides if o.get("disallow_untyped_defs") for m in o["module"]}


def _package_modules() -> set[str]:
    names = set()
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_module_is_type_checked_strictly():
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert sorted(_package_modules() - _strict_modules(pyproject)) == []


def test_the_strict_guard_sees_a_module_left_out():
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    left_out = pyproject.replace('    "ckpt_cli.planning.descent",\n', "")
    assert "ckpt_cli.planning.descent" in _package_modules() - _strict_modules(left_out)
