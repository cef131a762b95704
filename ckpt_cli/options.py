"""What a command is asked to do, as frozen values: built once (by the command line or a
library caller), checked by ``validate()``, and recorded by ``to_json()`` in reports and in
the written file's provenance.

``AnalysisOptions``: how to read the graph (symbolic dimensions, loss, gradient outputs).
``PlanOptions``: how to choose regions. ``RewriteOptions``: a plan's options and how to
write it. ``CheckOptions``: how ``ckpt check`` runs ONNX Runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from .errors import UsageError
from .planning.plan import Policy

MIN_PEAK = "min-peak"  # the default search without stopping at the knee
AUTO_NAMES = ("layers", "sqrt", "balanced", "budget", "optimal", MIN_PEAK)
DEFAULT_MAX_PREDICTION_ERROR = 0.10
ORT_OPTIMIZE_PROVIDERS = ("cpu", "cuda")


def _known(cls, keywords: Mapping[str, Any]) -> dict[str, Any]:
    """``keywords`` that are fields of ``cls``; any other is a TypeError, as for a call."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(keywords) - names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no option {unknown[0]!r}")
    return dict(keywords)


@dataclass(frozen=True)
class AnalysisOptions:
    """Symbolic dimensions bound to sizes, the loss output, the gradient outputs."""

    dims: Mapping[str, int] = field(default_factory=dict)
    loss: str | None = None
    grad_outputs: tuple[str, ...] = ()

    @classmethod
    def of(cls, dims=None, loss=None, grad_outputs=None) -> "AnalysisOptions":
        return cls(dict(dims or {}), loss, tuple(grad_outputs or ()))

    def validate(self) -> "AnalysisOptions":
        for name, value in self.dims.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UsageError(f"--dim {name}: a size is a positive integer, got {value!r}")
        return self

    def to_json(self) -> dict:
        return {"dims": [f"{k}={v}" for k, v in self.dims.items()], "loss": self.loss,
                "grad_outputs": list(self.grad_outputs)}


@dataclass(frozen=True)
class PlanOptions:
    """Regions marked by the user (name patterns, scopes, boundary tensors, a plan file), or
    a strategy (``auto``), or a peak budget; ``policy``: per-op rules every plan honours."""

    regions: tuple[str, ...] = ()
    regions_by_scope: str | None = None
    boundaries: tuple[str, ...] = ()
    plan_file: Path | None = None
    auto: str | None = None
    budget: str | None = None
    policy: Policy = field(default_factory=Policy)
    allow_unsized: bool = False  # plan even where a tensor's size is unknown (counted as 0 B)

    @classmethod
    def of(cls, **keywords) -> "PlanOptions":
        kw = _known(cls, keywords)
        for many in ("regions", "boundaries"):
            kw[many] = tuple(kw.get(many) or ())
        if kw.get("plan_file") is not None:
            kw["plan_file"] = Path(kw["plan_file"])
        kw["policy"] = kw.get("policy") or Policy()
        return cls(**kw)

    @property
    def manual(self) -> bool:
        return bool(self.regions or self.regions_by_scope or self.boundaries or self.plan_file)

    @property
    def searches_budget(self) -> bool:
        return self.budget is not None or self.auto in ("budget", "optimal")

    def validate(self) -> "PlanOptions":
        auto, budget = self.auto, self.budget
        if budget is not None and auto not in (None, "budget", "optimal"):
            raise UsageError(f"--budget goes with --auto budget (the default) or optimal, not --auto {auto}")
        if (auto or budget) and self.manual:
            raise UsageError("--auto/--budget choose regions themselves; drop --region/--regions-by-scope/"
                             "--boundary/--plan")
        if budget is None and auto in ("budget", "optimal"):
            raise UsageError(f"--auto {auto} needs --budget (e.g. --budget 2GiB or --budget 40%)")
        if auto is not None and auto not in AUTO_NAMES:
            raise UsageError(f"unknown --auto strategy '{auto}' (choose from {', '.join(AUTO_NAMES)})")
        return self

    def policy_json(self) -> dict:
        return {"recompute_ops": sorted(self.policy.recompute_ops), "keep_ops": sorted(self.policy.keep_ops)}

    def to_json(self) -> dict:
        return {"auto": self.auto, "budget": self.budget, **self.policy_json()}


@dataclass(frozen=True)
class RewriteOptions:
    """A plan's options, and how the rewrite is written: ``no_recompute`` (the order only),
    ``pin`` (guard nodes hold the order), ``keep_mem_pattern`` (leave ORT's memory pattern to
    the session), ``ort_optimize`` (then let ORT fuse the graph for this provider)."""

    plan: PlanOptions = field(default_factory=PlanOptions)
    no_recompute: bool = False
    pin: bool = True
    keep_mem_pattern: bool = False
    ort_optimize: str | None = None

    @classmethod
    def of(cls, *, no_recompute: bool = False, pin: bool = True, keep_mem_pattern: bool = False,
           ort_optimize: str | None = None, plan=None, **plan_keywords) -> "RewriteOptions":
        """The keyword form: ``plan`` is the plan file (as ``rewrite_model(plan=...)``)."""
        return cls(PlanOptions.of(plan_file=plan, **plan_keywords), no_recompute, pin, keep_mem_pattern,
                   ort_optimize)

    def validate(self) -> "RewriteOptions":
        if self.ort_optimize not in (None, *ORT_OPTIMIZE_PROVIDERS):
            raise UsageError(f"--ort-optimize {self.ort_optimize}: choose cpu or cuda")
        p = self.plan
        if self.no_recompute and (p.manual or p.auto or p.budget):
            raise UsageError("--no-recompute takes no region options")
        p.validate()
        return self

    def to_json(self) -> dict:
        p = self.plan
        return {"regions": list(p.regions), "regions_by_scope": p.regions_by_scope,
                "boundaries": list(p.boundaries), "plan": str(p.plan_file) if p.plan_file else None,
                "no_recompute": self.no_recompute, "pin": self.pin, "keep_mem_pattern": self.keep_mem_pattern,
                "auto": p.auto, "budget": p.budget, "ort_optimize": self.ort_optimize, **p.policy_json()}


@dataclass(frozen=True)
class CheckOptions:
    """How ``check_models`` (and ``rewrite_model(check=...)``) run ONNX Runtime."""

    provider: str = "auto"
    runs: int = 3
    seed: int = 0
    feeds_file: Path | None = None
    python: str | None = None
    rtol: float | None = None
    atol: float | None = None
    timeout: float | None = 600.0
    max_prediction_error: float = DEFAULT_MAX_PREDICTION_ERROR

    def validate(self) -> "CheckOptions":
        if self.runs < 1:
            raise UsageError(f"--runs {self.runs}: at least one run")
        if self.max_prediction_error < 0:
            raise UsageError(f"--max-prediction-error {self.max_prediction_error}: not below 0")
        return self

    def to_json(self) -> dict:
        return {"provider": self.provider, "runs": self.runs, "seed": self.seed,
                "feeds": str(self.feeds_file) if self.feeds_file else None, "python": self.python,
                "rtol": self.rtol, "atol": self.atol, "timeout": self.timeout,
                "max_prediction_error": self.max_prediction_error}
