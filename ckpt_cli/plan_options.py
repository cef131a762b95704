"""Click options of the planning library that ``plan`` and ``rewrite`` share (kept out of
cli.py, and light: imported when the CLI starts)."""

from __future__ import annotations

import click

from .errors import UsageError


def policy_options(f):
    """The per-op policy options: ``--recompute-ops`` and ``--keep-ops``."""
    f = click.option("--keep-ops", metavar="OP,OP", default="",
                     help="Never recompute outputs of these op types, e.g. MatMul,Gemm (every strategy).")(f)
    f = click.option("--recompute-ops", metavar="OP,OP", default="",
                     help="Never keep outputs of these op types in recomputed parts, e.g. Add,Mul,Gelu "
                          "(every strategy).")(f)
    return f


def policy_from(recompute_ops: str, keep_ops: str):
    """A planning Policy from the option values; an op in both lists is a usage error."""
    from .planning.plan import Policy

    recompute = frozenset(op.strip() for op in recompute_ops.split(",") if op.strip())
    keep = frozenset(op.strip() for op in keep_ops.split(",") if op.strip())
    if recompute & keep:
        raise UsageError(f"--recompute-ops and --keep-ops both name {', '.join(sorted(recompute & keep))}")
    return Policy(keep, recompute)
