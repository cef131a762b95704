"""The data walk: how often following the model through ckpt goes back to a module it left.

    python -m bench.data_walk            # rewrite and inspect, figures and targets
    python -m bench.data_walk --trace    # and every hop of each walk

A static reading of ``ckpt_cli`` with ``ast``, nothing is run. The walk starts at a CLI
command's function with its ``model`` argument and goes through every call that is passed
the model or anything made from it, in the order the calls stand in the code, depth first.
Within a function, a name is made from the model when it is assigned (or bound by ``for``,
``with`` or ``:=``) from an expression that reads the model or such a name. A call is
followed when its callee resolves to a function of the package: a module-level function
(imported at module or function level, or defined beside the caller), a class (its
``__init__`` or ``__post_init__``, when it has one), a method of the caller's own class on
``self``/``cls``, or a method called on a name made from the model whose name one class of the
package alone defines. A function is walked once, at the first call that reaches it; a later
call to it is still a hop there and back. Each change of module is a hop; a hop into a
module the walk has already left is a return, and returns are what is counted.

Targets (the issue): rewrite walk returns <= 30, inspect <= 20.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ckpt_cli"
TARGETS = {"rewrite": 30, "inspect": 20}
COMMANDS_MODULE = "ckpt_cli.cli.commands"
# A method called on the model's data is resolved by its name alone: never names the builtin
# containers and strings have too (``x.get``, ``x.update`` are a dict's far more often).
BUILTIN_METHODS = frozenset().union(*(dir(t) for t in (dict, list, set, frozenset, str, bytes, tuple, int, float)))


@dataclass
class Function:
    module: str
    qualname: str  # "f" or "Class.f"
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None = None


@dataclass
class Package:
    functions: dict[str, Function] = field(default_factory=dict)  # "module:qualname" -> function
    imports: dict[str, dict[str, str]] = field(default_factory=dict)  # module -> local name -> target
    methods: dict[str, list[str]] = field(default_factory=dict)  # method name -> keys of its definitions
    classes: dict[str, str] = field(default_factory=dict)  # "module:Class" -> module


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_targets(node: ast.AST, module: str, is_package: bool) -> dict[str, str]:
    """Local name -> "module" or "module:name" for the imports of ckpt_cli in ``node``."""
    out: dict[str, str] = {}
    base = module if is_package else module.rpartition(".")[0]
    for imp in ast.walk(node):
        if isinstance(imp, ast.ImportFrom):
            if imp.level:
                parts = base.split(".")
                source = ".".join(parts[:len(parts) - imp.level + 1] + ([imp.module] if imp.module else []))
            else:
                source = imp.module or ""
            if source.split(".")[0] != "ckpt_cli":
                continue
            for a in imp.names:
                out[a.asname or a.name] = f"{source}:{a.name}"
        elif isinstance(imp, ast.Import):
            for a in imp.names:
                if a.name.split(".")[0] == "ckpt_cli":
                    out[a.asname or a.name] = a.name
    return out


def index() -> Package:
    pkg = Package()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        pkg.imports[module] = _import_targets(tree, module, path.name == "__init__.py")
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                pkg.functions[f"{module}:{node.name}"] = Function(module, node.name, node)
            elif isinstance(node, ast.ClassDef):
                pkg.classes[f"{module}:{node.name}"] = module
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        key = f"{module}:{node.name}.{item.name}"
                        pkg.functions[key] = Function(module, f"{node.name}.{item.name}", item, node.name)
                        pkg.methods.setdefault(item.name, []).append(key)
    return pkg


def _resolve_name(pkg: Package, module: str, target: str) -> str | None:
    """``module:name`` (or a module) -> a function key, following re-exports and classes."""
    for _ in range(8):  # re-export chains are short
        if target in pkg.functions:
            return target
        if target in pkg.classes:
            for init in ("__init__", "__post_init__"):
                if f"{target}.{init}" in pkg.functions:
                    return f"{target}.{init}"
            return None
        source, _, name = target.partition(":")
        if not name:
            return None
        if source in pkg.imports and name in pkg.imports[source]:
            target = pkg.imports[source][name]
        elif f"{source}.{name}" in pkg.imports:  # `from . import api`: a module
            return None
        else:
            return None
    return None


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _bound(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _made_from(fn: ast.FunctionDef | ast.AsyncFunctionDef, tainted: set[str]) -> set[str]:
    """``tainted`` and every name assigned from them in ``fn``, to a fixed point."""
    made = set(tainted)
    flows: list[tuple[set[str], set[str]]] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            flows.append((_names(node.value), set().union(*(_bound(t) for t in node.targets))))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            flows.append((_names(node.value), _bound(node.target)))
        elif isinstance(node, (ast.For, ast.comprehension)):
            flows.append((_names(node.iter), _bound(node.target)))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            flows.append((_names(node.context_expr), _bound(node.optional_vars)))
        elif isinstance(node, ast.NamedExpr):
            flows.append((_names(node.value), {node.target.id}))
    grown = True
    while grown:
        grown = False
        for reads, binds in flows:
            if reads & made and not binds <= made:
                made |= binds
                grown = True
    return made


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args]


def _callee(pkg: Package, caller: Function, call: ast.Call, local: dict[str, str], made: set[str]) -> str | None:
    f = call.func
    if isinstance(f, ast.Name):
        if f.id in local:
            return _resolve_name(pkg, caller.module, local[f.id])
        return _resolve_name(pkg, caller.module, f"{caller.module}:{f.id}")
    if not isinstance(f, ast.Attribute):
        return None
    if isinstance(f.value, ast.Name):
        owner = f.value.id
        if owner in ("self", "cls") and caller.cls is not None:
            return _resolve_name(pkg, caller.module, f"{caller.module}:{caller.cls}.{f.attr}")
        target = local.get(owner)
        if target is not None and ":" not in target:  # a module imported whole
            return _resolve_name(pkg, target, f"{target}:{f.attr}")
        if target is not None and target.partition(":")[2] and f"{target}.{f.attr}" in pkg.functions:
            return f"{target}.{f.attr}"  # Class.method
    if _names(f.value) & made and f.attr not in BUILTIN_METHODS:
        defined = pkg.methods.get(f.attr, [])
        return defined[0] if len(defined) == 1 else None
    return None


def _passes(call: ast.Call, callee: Function, made: set[str]) -> set[str]:
    """The callee's parameters that receive the model (or what is made from it)."""
    params = _params(callee.node)
    if callee.cls is not None and params and params[0] in ("self", "cls"):
        receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
        bound = {params[0]} if receiver is not None and _names(receiver) & made else set()
        params = params[1:]
    else:
        bound = set()
    for k, arg in enumerate(call.args):
        if k < len(params) and _names(arg) & made:
            bound.add(params[k])
    for kw in call.keywords:
        if kw.arg is not None and _names(kw.value) & made:
            bound.add(kw.arg)
        elif kw.arg is None and _names(kw.value) & made and callee.node.args.kwarg is not None:
            bound.add(callee.node.args.kwarg.arg)
    return bound


@dataclass
class Walk:
    hops: list[tuple[str, str]] = field(default_factory=list)  # (module, function key) in walk order
    walked: set[str] = field(default_factory=set)
    calls: int = 0

    def enter(self, key: str, module: str) -> None:
        if not self.hops or self.hops[-1][0] != module:
            self.hops.append((module, key))

    def returns(self) -> int:
        left: set[str] = set()
        count = 0
        for (prev, _), (now, _) in zip(self.hops, self.hops[1:]):
            left.add(prev)
            count += now in left
        return count


def walk(pkg: Package, key: str, tainted: set[str], trail: Walk) -> None:
    fn = pkg.functions[key]
    trail.enter(key, fn.module)
    if key in trail.walked:
        return
    trail.walked.add(key)
    local = {**pkg.imports.get(fn.module, {}), **_import_targets(fn.node, fn.module, False)}
    made = _made_from(fn.node, tainted)
    calls = sorted((n for n in ast.walk(fn.node) if isinstance(n, ast.Call)),
                   key=lambda n: (n.lineno, n.col_offset))
    for call in calls:
        if not any(_names(x) & made for x in [call.func, *call.args, *(k.value for k in call.keywords)]):
            continue
        target = _callee(pkg, fn, call, local, made)
        if target is None or target == key:
            continue
        bound = _passes(call, pkg.functions[target], made)
        if not bound:
            continue
        trail.calls += 1
        walk(pkg, target, bound, trail)
        trail.enter(key, fn.module)


def measure(commands: tuple[str, ...] = tuple(TARGETS), trail: bool = False) -> dict:
    pkg = index()
    out = {}
    for command in commands:
        w = Walk()
        walk(pkg, f"{COMMANDS_MODULE}:{command}", {"model"}, w)
        modules = list(dict.fromkeys(m for m, _ in w.hops))
        out[command] = {"returns": w.returns(), "target": TARGETS.get(command), "hops": len(w.hops) - 1,
                        "calls_followed": w.calls, "functions": len(w.walked), "modules": len(modules)}
        if trail:
            out[command]["trail"] = [f"{m} ({k.partition(':')[2]})" for m, k in w.hops]
    return out


def render(res: dict | None, add) -> None:
    add("## Data walk (static: the model followed from the command through every call, in order)")
    add("")
    if not res:
        add("Not measured.")
        add("")
        return
    add("| command | returns to a module left | target | hops | calls followed | functions | modules |")
    add("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for command, r in res.items():
        target = f"<= {r['target']}" if r.get("target") is not None else ""
        add(f"| {command} | {r['returns']} | {target} | {r['hops']} | {r['calls_followed']} | {r['functions']} "
            f"| {r['modules']} |")
    add("")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.data_walk", description=__doc__.split("\n")[0])
    ap.add_argument("--trace", action="store_true", help="print every hop of each walk")
    ap.add_argument("--json", action="store_true", help="the figures as JSON (the trail too)")
    a = ap.parse_args(argv)
    res = measure(trail=a.trace or a.json)
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    for command, r in res.items():
        verdict = "" if r["target"] is None else (" (target met)" if r["returns"] <= r["target"] else " (over target)")
        print(f"{command}: {r['returns']} returns to a module left, target <= {r['target']}{verdict}; "
              f"{r['hops']} hops, {r['calls_followed']} calls followed, {r['functions']} functions, "
              f"{r['modules']} modules")
        if a.trace:
            for hop in r["trail"]:
                print(f"  {hop}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
