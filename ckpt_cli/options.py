"""What a command is asked to do, as frozen values: built once (by the command line or a
library caller), checked by ``validate()``, and recorded by ``to_json()`` in reports and in
the written file's provenance.

``AnalysisOptions``: how to read the graph (symbolic dimensions, loss, gradient outputs).
``PlanOptions``: how to choose regions. ``RewriteOptions``: a plan's options and how to
write it. ``CheckOptions``: how ``ckpt check`` runs ONNX Runtime.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from .errors import OptionError

if TYPE_CHECKING:
    from .planning.plan import Policy
    from _typeshed import DataclassInstance


def _policy() -> Policy:
    """No per-op rules. Imported when first needed: the CLI reads this module's names to
    build its options, and ``ckpt --version`` or ``--help`` should not load the planner."""
    from .planning.plan import Policy

    return Policy()


MIN_PEAK = "min-peak"  # the default search without stopping at the knee
AUTO_NAMES = ("layers", "sqrt", "balanced", "budget", "optimal", MIN_PEAK)
DEFAULT_MAX_PREDICTION_ERROR = 0.10
ORT_OPTIMIZE_PROVIDERS = ("cpu", "cuda")
CHECK_PROVIDERS = ("auto", "cuda", "cpu")
# One ONNX Runtime child (a measured model's warm-up and runs, an offline optimization) may
# run this long by default: a hung or thrashing ORT must end in an error, not hold CI.
DEFAULT_TIMEOUT_S = 600.0


def _strings(name: str, value: object) -> tuple[str, ...]:
    """A list of names or patterns; one string alone is refused rather than split into characters."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name}: expected a list of strings, got {type(value).__name__} {_short(value)}")
    items = tuple(value)
    return tuple(_text(name, item) for item in items)


def _text(name: str, value: object) -> str:
    """A string that is UTF-8 text, as node and tensor names are (a command-line word in
    another encoding reaches Python with its bytes kept as surrogates)."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a string, got {type(value).__name__} {_short(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        shown = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise OptionError(f"{name} '{shown}' is not UTF-8 text; node and tensor names are") from e
    return value


def _short(value: object) -> str:
    """A value for a message, cut short: a model's repr runs to megabytes."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(name: str, value: object, low: float, high: float, optional: bool = False) -> None:
    """``value`` is a finite real number in [low, high] (or None when ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__} {_short(value)}")
    if not (math.isfinite(value) and low <= value <= high):
        raise OptionError(f"{name} {value!r}: expected a number from {low:g} to {high:g}")


def validate_timeout(value: object) -> None:
    """Seconds a child process of ONNX Runtime may run (``--timeout``), or None: no limit."""
    _number("--timeout", value, 1, 86400, optional=True)


def _integer(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {_short(value)}")
    _number(name, value, low, high)


def _known(cls: type[DataclassInstance], keywords: Mapping[str, Any]) -> dict[str, Any]:
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
    def of(cls, dims: Mapping[str, int] | None = None, loss: str | None = None,
           grad_outputs: Iterable[str] | None = None) -> "AnalysisOptions":
        if dims is not None and not isinstance(dims, Mapping):
            raise TypeError(f"dims: expected a mapping of names to sizes, got {type(dims).__name__} {_short(dims)}")
        return cls(dict(dims or {}), loss, _strings("grad_outputs", grad_outputs))

    def validate(self) -> "AnalysisOptions":
        for name, value in self.dims.items():
            _text("dims", name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise OptionError(f"--dim {name}: a size is a positive integer, got {_short(value)}")
        if self.loss is not None:
            _text("loss", self.loss)
        _strings("grad_outputs", self.grad_outputs)
        return self

    def to_json(self) -> dict[str, Any]:
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
    policy: Policy = field(default_factory=_policy)
    activation_budget: float | None = None  # a share of the no-recompute plan's activation bytes
    allow_unsized: bool = False  # plan even where a tensor's size is unknown (counted as 0 B)

    @classmethod
    def of(cls, **keywords: Any) -> "PlanOptions":
        kw = _known(cls, keywords)
        for many in ("regions", "boundaries"):
            kw[many] = _strings(many, kw.get(many))
        if kw.get("plan_file") is not None:
            if not isinstance(kw["plan_file"], (str, os.PathLike)):
                raise TypeError(f"plan: expected a path, got {type(kw['plan_file']).__name__}")
            kw["plan_file"] = Path(kw["plan_file"])
        budget = kw.get("budget")
        if isinstance(budget, (int, float)) and not isinstance(budget, bool):
            kw["budget"] = f"{budget:.0f}"  # a number of bytes
        kw["policy"] = kw.get("policy") or _policy()
        return cls(**kw)

    @property
    def manual(self) -> bool:
        return bool(self.regions or self.regions_by_scope or self.boundaries or self.plan_file)

    @property
    def searches_budget(self) -> bool:
        return self.budget is not None or self.auto in ("budget", "optimal")

    def validate(self) -> "PlanOptions":
        self._validate_types()
        auto, budget = self.auto, self.budget
        self._validate_activation_budget()
        if budget is not None and auto not in (None, "budget", "optimal"):
            raise OptionError(f"--budget goes with --auto budget (the default) or optimal, not --auto {auto}")
        if (auto or budget) and self.manual:
            raise OptionError("--auto/--budget choose regions themselves; drop --region/--regions-by-scope/"
                              "--boundary/--plan")
        if budget is None and auto in ("budget", "optimal"):
            raise OptionError(f"--auto {auto} needs --budget (e.g. --budget 2GiB or --budget 40%)")
        if auto is not None and auto not in AUTO_NAMES:
            raise OptionError(f"unknown --auto strategy '{auto}' (choose from {', '.join(AUTO_NAMES)})")
        return self

    def _validate_types(self) -> None:
        _strings("--region", self.regions)
        _strings("--boundary", self.boundaries)
        for name, value in (("--regions-by-scope", self.regions_by_scope), ("--auto", self.auto),
                            ("--budget", self.budget)):
            if value is not None:
                _text(name, value)
        from .planning.plan import Policy

        if not isinstance(self.policy, Policy):
            raise TypeError(f"policy: expected a ckpt_cli.planning.plan.Policy, got {type(self.policy).__name__}")

    def _validate_activation_budget(self) -> None:
        share = self.activation_budget
        if share is None:
            return
        if isinstance(share, bool) or not isinstance(share, (int, float)):
            raise TypeError(f"activation_budget: expected a number in [0, 1], got {type(share).__name__}")
        if not 0.0 <= share <= 1.0:
            raise OptionError(f"--activation-budget takes a share of the activation bytes in [0, 1], got {share!r}")
        if self.budget is not None or self.auto is not None or self.manual:
            raise OptionError("--activation-budget chooses regions itself; drop --budget/--auto/--region/"
                              "--regions-by-scope/--boundary/--plan")

    def policy_json(self) -> dict[str, list[str]]:
        return {"recompute_ops": sorted(self.policy.recompute_ops), "keep_ops": sorted(self.policy.keep_ops)}

    def activation_json(self) -> dict[str, float]:
        """``activation_budget`` where it is given (reports without it stay as they were)."""
        return {"activation_budget": self.activation_budget} if self.activation_budget is not None else {}

    def to_json(self) -> dict[str, Any]:
        return {"auto": self.auto, "budget": self.budget, **self.activation_json(), **self.policy_json()}


@dataclass(frozen=True)
class RewriteOptions:
    """A plan's options, and how the rewrite is written: ``no_recompute`` (the order only),
    ``pin`` (guard nodes hold the order), ``keep_mem_pattern`` (leave ORT's memory pattern to
    the session and the model's inputs as they are; False adds the input that turns the
    pattern off where that predicts less), ``ort_optimize`` (then let ORT fuse the graph for
    this provider, in a child process that may run ``timeout`` seconds; None: no limit)."""

    plan: PlanOptions = field(default_factory=PlanOptions)
    no_recompute: bool = False
    pin: bool = True
    keep_mem_pattern: bool = True
    ort_optimize: str | None = None
    timeout: float | None = DEFAULT_TIMEOUT_S  # how long, not what: not recorded by to_json
    # an interpreter with onnxruntime-training: an ORT training artifact's default is chosen
    # by training its plans there (verify/module_choice.py); a machine's path, not recorded
    trainer: str | None = None
    # grouped 1-D ConvGrads in their 2-D form (rewrite/ort_defects.py): ORT 1.19.2's 1-D kernel
    # writes past its buffers
    work_around_ort_defects: bool = False

    @classmethod
    def of(cls, *, plan: str | os.PathLike[str] | None = None, **keywords: Any) -> "RewriteOptions":
        """The keyword form: this class's fields by name (``no_recompute``, ``pin``, ...), the
        plan's options (PlanOptions.of) beside them; ``plan`` is the plan file (as
        ``rewrite_model(plan=...)``)."""
        own = {f.name for f in fields(cls)} - {"plan"}
        mine = {k: keywords.pop(k) for k in list(keywords) if k in own}
        return cls(PlanOptions.of(plan_file=plan, **keywords), **mine)

    def validate(self) -> "RewriteOptions":
        if self.ort_optimize not in (None, *ORT_OPTIMIZE_PROVIDERS):
            raise OptionError(f"--ort-optimize {self.ort_optimize}: choose cpu or cuda")
        validate_timeout(self.timeout)
        p = self.plan
        if self.no_recompute and (p.manual or p.auto or p.budget):
            raise OptionError("--no-recompute takes no region options")
        if self.no_recompute and p.activation_budget is not None:
            raise OptionError("--no-recompute recomputes nothing: drop --activation-budget (or use 1)")
        p.validate()
        return self

    def to_json(self) -> dict[str, Any]:
        p = self.plan
        return {"regions": list(p.regions), "regions_by_scope": p.regions_by_scope,
                "boundaries": list(p.boundaries), "plan": str(p.plan_file) if p.plan_file else None,
                "no_recompute": self.no_recompute, "pin": self.pin, "keep_mem_pattern": self.keep_mem_pattern,
                "auto": p.auto, "budget": p.budget, **p.activation_json(), "ort_optimize": self.ort_optimize,
                **p.policy_json(), **({"work_around_ort_defects": True} if self.work_around_ort_defects else {})}


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
    timeout: float | None = DEFAULT_TIMEOUT_S
    max_prediction_error: float = DEFAULT_MAX_PREDICTION_ERROR

    def validate(self) -> "CheckOptions":
        """The ranges the command line's options allow."""
        if self.provider not in CHECK_PROVIDERS:
            raise OptionError(f"provider {_short(self.provider)}: choose {', '.join(CHECK_PROVIDERS)}")
        _integer("--runs", self.runs, 1, 100)
        _integer("--seed", self.seed, 0, 2**31 - 1)
        _number("--rtol", self.rtol, 0, 1, optional=True)
        _number("--atol", self.atol, 0, math.inf, optional=True)
        validate_timeout(self.timeout)
        _number("--max-prediction-error", self.max_prediction_error, 0, 10)
        for name, value in (("feeds_file", self.feeds_file), ("python", self.python)):
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise TypeError(f"{name}: expected a path, got {type(value).__name__} {_short(value)}")
        return self

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "runs": self.runs, "seed": self.seed,
                "feeds": str(self.feeds_file) if self.feeds_file else None, "python": self.python,
                "rtol": self.rtol, "atol": self.atol, "timeout": self.timeout,
                "max_prediction_error": self.max_prediction_error}
