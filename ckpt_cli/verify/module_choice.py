"""Judge an ORT training artifact's default in the session its users run: the Module API, untuned.

Users of ``generate_artifacts``' output train through ``Module`` + ``Optimizer`` with ORT's
defaults: ORT_ENABLE_ALL's fusions, DEFAULT order, the memory pattern, buffer reuse and the
arena. ckpt's model of that session (``module_model.py``) comes within 4% of its process peak
on the artifact zoo's 84 graphs, but only a run shows whether a fusion treats a recompute
copy unlike its original and rounds the loss differently. With an interpreter that has
onnxruntime-training (``--python``), the default's plan and the plans with less recompute
along its front are trained there instead, a few
steps each from the artifact's checkpoint, lowest predicted peak first, untuned and under
the settings ckpt records for it (the original too, under the same settings). A plan
passes when its process peak is not above the original's untuned, nor under its settings
above the original's untuned or (beyond a Module session's measurement noise) the original's
under the same settings, with the original's losses bit for bit in both.
The plans are trained as written until one passes (plan k; all of them when none does),
then plans 0..k (all) again written with their tensors' shapes hidden from ORT's memory
planning (``io/written.py``'s ``unplanned_shapes``: the memory pattern and buffer reuse off
tensor by tensor, which a Module's user session otherwise keeps on), and a plan so written
that passes untuned but not under its settings once more with the dimensions that move
alike sharing a symbol (buffer reuse kept, the pattern still off): at most three trials a
plan. The trial that passes untuned only, at the lowest peak there, and then the trial
taken, are trained once more with ORT's CPU arena off in the settings they record
(``_Trials.arena_off``; the file then says so, and a user's session under them must turn the
arena off too). Of all the trials
that pass, the lowest untuned peak is written (of two within ``UNTUNED_TRADE`` of the
original's peak there, the lower under its settings). The plans are pinned
with the waits of ``rewrite/pin.py`` (the untuned session runs ORT's DEFAULT order). When
none passes, the graph is written unchanged, with the figures in one line.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import onnx

from ..analysis import Analysis
from ..errors import CkptError, RunFailed
from ..io.save import save_model
from ..planning.budget import Planned
from ..planning.plan import Plan
from ..planning.search import PlanCost
from ..rewrite import RewriteResult, pinned, rewrite
from ..rewrite.mem_pattern import is_ort_artifact
from ..units import human_bytes
from .driver import WorkerOptions
from ..background import side_by_side
from .module_runs import STEPS, artifact_files, run_module
from .records import ModuleRun
from .rules import module_noise
from .feeds import prepare_feeds


# Of two trials that pass, both at or below the original untuned, one this share of the
# original's untuned peak lower there gives way to one lower under its settings: zoo latent's
# unplanned plan 0 measured 14.88 MiB untuned and 15.48 under its settings, plan 2 15.17 and
# 11.74 (the original 25.23 untuned).
UNTUNED_TRADE = 0.02


@dataclass(frozen=True)
class Writer:
    """How the command writes a rewrite: ``finish`` turns the pinned rewrite into the one
    written, ``model(result, plan)`` makes its file's model (metadata and the shapes of
    symbolic dimensions included: the Module's session plans its memory from them), so
    what is trained is byte for byte what would be written. ``model(result, plan, True)``:
    the same with its tensors' shapes hidden from ORT's memory planning
    (``io/written.py``'s ``unplanned_shapes``), or None where nothing is hidden;
    ``model(result, plan, True, True)``: so hidden, dimensions that move alike sharing a symbol."""

    finish: Callable[[RewriteResult], RewriteResult] | None
    model: Callable[..., onnx.ModelProto | None]

    def result(self, result: RewriteResult) -> RewriteResult:
        return self.finish(result) if self.finish is not None else result

    def save(self, a: Analysis, result: RewriteResult, plan: Plan | None, path: Path,
             writing: tuple[bool, bool]) -> bool:
        """Writes the model to ``path`` (``writing``: unplanned, shared); False (nothing
        written) where the unplanned writing hides nothing."""
        source = a.graph.path.parent if a.graph.path is not None else None
        model = self.model(result, plan, *writing)
        if model is None:
            return False
        save_model(model, path, source_dir=source, force=True)
        return True

    def written(self, result: RewriteResult, plan: Plan | None, unplanned: bool = False,
                shared: bool = False) -> onnx.ModelProto:
        """The model the command writes: with ``unplanned``, hidden where anything is."""
        model = self.model(result, plan, unplanned, shared) if unplanned else None
        model = model if model is not None else self.model(result, plan)
        assert model is not None
        return model


# Each trial is two training children (a few seconds on the zoo's models), at most three
# a plan (``_Trials``): the default's plan and at most this many with less recompute.
MAX_FALLBACKS = 5

# A plan tried, its cost, and the search's unpinned rewrite of it (None: rewritten when tried).
Candidate = tuple[Plan, PlanCost, RewriteResult | None]
# What every trial of one artifact trains against: the training model, its artifact's
# other files, the feeds, how the children run, and the original's untuned run.
TrialRun = tuple[Path, dict[str, str], Path, WorkerOptions, ModuleRun]


@dataclass(frozen=True)
class ModuleJudged:
    """One plan trained by the Module API untuned: its recompute, ckpt's predicted peak
    under its settings, and the measured process peak and whether the losses matched."""

    recompute_flops: int
    settings_peak_bytes: int  # predicted
    peak_bytes: int | None  # measured untuned; None: the Module API did not train it (``error``)
    identical_untuned: bool  # the original's losses, untuned
    error: str | None = None
    peak_bytes_settings: int | None = None  # measured under the settings ckpt records for it
    identical_settings: bool = False  # the original's losses under the same settings
    original_peak_settings: int | None = None  # the original's, measured under the same settings
    unplanned: bool = False  # written with its tensors' shapes hidden from ORT's memory planning
    shared: bool = False  # so hidden, the dimensions that move alike sharing a symbol
    plan: int = 0  # its place among the plans tried: 0 the default's, then less recompute
    arena: bool = True  # ORT's CPU arena in the settings recorded for it (``_Trials.arena_off``)

    @property
    def identical(self) -> bool:
        return self.identical_untuned and self.identical_settings

    def untuned_accepted(self, original_peak: int) -> bool:
        """Trained with the original's losses untuned, and not above its peak there."""
        return (self.error is None and self.identical_untuned and self.peak_bytes is not None
                and self.peak_bytes <= original_peak)

    def accepted(self, original_peak: int) -> bool:
        """Trained with the original's losses, and not above the original's peak untuned,
        nor under its settings above the original's untuned or under the same settings."""
        peak, settings_peak = self.peak_bytes, self.peak_bytes_settings
        if self.error is not None or not self.identical or peak is None or settings_peak is None:
            return False
        # Under the settings the two files are compared as the check compares them: a rise
        # within a Module session's measurement noise is not the rewrite's (zoo lstm's plan,
        # arena off: +32 KiB on 10.4 MB in one run, -1.4% in another).
        settings_original = self.original_peak_settings or original_peak
        return (peak <= original_peak and settings_peak <= original_peak
                and settings_peak <= settings_original + module_noise(settings_original))

    def to_json(self) -> dict[str, Any]:
        return {"recompute_flops": self.recompute_flops, "settings_peak_bytes": self.settings_peak_bytes,
                "peak_bytes": self.peak_bytes, "peak_bytes_under_settings": self.peak_bytes_settings,
                "original_peak_bytes_under_settings": self.original_peak_settings,
                "losses_identical": self.identical, "losses_identical_untuned": self.identical_untuned,
                "losses_identical_under_settings": self.identical_settings, "unplanned_shapes": self.unplanned,
                "unplanned_shared": self.shared, "enable_cpu_mem_arena": self.arena,
                "plan": self.plan, "error": self.error}


@dataclass(frozen=True)
class ModuleChoice:
    """The original's measured untuned peak, the plans trained (the default's first), and
    the one taken (None: none, the graph is written unchanged)."""

    original_peak_bytes: int
    judged: tuple[ModuleJudged, ...]
    chosen: int | None
    steps: int

    @property
    def unplanned(self) -> bool:
        """Whether the plan taken is written with its shapes hidden from ORT's memory planning."""
        return self.chosen is not None and self.judged[self.chosen].unplanned

    @property
    def shared(self) -> bool:
        """Whether it is so written with the dimensions that move alike sharing a symbol."""
        return self.chosen is not None and self.judged[self.chosen].shared

    def ratio(self, i: int) -> float:
        return (self.judged[i].peak_bytes or 0) / max(1, self.original_peak_bytes)

    def line(self) -> str:
        head = (f"trained by the Module API untuned ({self.steps} steps), the original's process peak is "
                f"{human_bytes(self.original_peak_bytes)}")
        if self.chosen is None:
            return head + (f"; none of the {len(self.judged)} plans tried stays at or below it with the "
                           f"original's losses bit for bit ({self._why_not()}): the graph is written unchanged")
        taken = self.judged[self.chosen]
        k = taken.plan
        which = "the default's plan" if k == 0 else f"plan {k + 1} of the front (less recompute)"
        if taken.unplanned:
            why = ("lower than as written" if any(not j.unplanned and j.accepted(self.original_peak_bytes)
                                                  for j in self.judged) else "with the plain writing, none of the plans passes")
            which += (", its tensors declared by symbols of their own (out of ORT's memory pattern "
                      + ("; one symbol to the dimensions that move alike, so buffer reuse kept; " if taken.shared
                         else "and buffer reuse; ") + f"{why}),")
        settings = (taken.peak_bytes_settings or 0) / max(1, self.original_peak_bytes)
        arena = "" if taken.arena else " (recorded with ORT's CPU arena off: with it, above the original there)"
        beside = ("" if taken.original_peak_settings is None else
                  f"; the original under the same settings: {human_bytes(taken.original_peak_settings)}")
        return (head + f"; {which} measures {human_bytes(taken.peak_bytes or 0)} there ({self.ratio(self.chosen):.2f}x)"
                f" and {human_bytes(taken.peak_bytes_settings or 0)} under ckpt's settings ({settings:.2f}x){arena}, "
                f"with the same losses{beside}")

    def _why_not(self) -> str:
        def one(j: ModuleJudged) -> str:
            if j.error is not None or j.peak_bytes is None or j.peak_bytes_settings is None:
                return "not trained"
            base = max(1, self.original_peak_bytes)
            differ = [w for w, same in (("untuned", j.identical_untuned), ("under its settings", j.identical_settings))
                      if not same]
            tuned = j.peak_bytes_settings / max(1, j.original_peak_settings or base)
            return (f"{j.peak_bytes / base:.2f}x, {tuned:.2f}x the original under its settings"
                    + (f", losses differ {' and '.join(differ)}" if differ else ""))
        return "; ".join(one(j) for j in self.judged)

    def to_json(self) -> dict[str, Any]:
        return {"session": "Module API, ORT's defaults", "steps": self.steps,
                "original_peak_bytes": self.original_peak_bytes,
                "judged": [j.to_json() for j in self.judged], "chosen": self.chosen}


def judged_by_training(a: Analysis) -> bool:
    """Whether ``a`` is an ORT training artifact on disk with its checkpoint beside it."""
    return _artifact(a) is not None


def _artifact(a: Analysis) -> tuple[Path, dict[str, str]] | None:
    """The training model's file and its artifact's other files, when ``judged_by_training``."""
    path = a.graph.path
    if not is_ort_artifact(a.graph) or path is None:
        return None
    files = artifact_files(path)
    return None if isinstance(files, str) else (path, files)


def _candidates(plan: Plan, planned: Planned) -> list[Candidate]:
    return [(plan, planned.cost, planned.result), *planned.fallbacks[:MAX_FALLBACKS]]


def judged_in_module(a: Analysis, planned: Planned, feeds_model: onnx.ModelProto, worker: WorkerOptions,
                     writer: Writer) -> Planned:
    """``planned`` (the default of an artifact), or the plan of its front, in the writing,
    that the Module API trains at the lowest untuned peak of those at no more than the
    original's with the same losses (``_Trials``), with the choice recorded; ``planned`` as
    it is where nothing can be judged."""
    if planned.user or planned.budget is not None or planned.plan is None or planned.cost is None:
        return planned
    artifact = _artifact(a)
    if artifact is None:
        return planned
    model_path, files = artifact
    candidates = _candidates(planned.plan, planned)
    with tempfile.TemporaryDirectory(prefix="ckpt_module_choice_") as tmp:
        feeds = Path(tmp) / "feeds.npz"
        prepare_feeds(feeds_model, feeds, worker.seed, dict(a.dims), None)
        try:
            original = run_module(model_path, files, feeds, None, worker, STEPS)
        except RunFailed as e:
            if e.kind == "timeout":
                raise
            planned.plan.notes.append(f"the Module API did not train the original here ({e.message}): "
                                      "the default is judged by ckpt's model of its session")
            return planned
        trials = _Trials(a, candidates, writer, Path(tmp), (model_path, files, feeds, worker, original))
        judged, written, chosen = trials.run()
    choice = ModuleChoice(original.peak_bytes, tuple(judged), chosen, STEPS)
    if chosen is None:
        return replace(planned, module=choice)
    k = judged[chosen].plan
    plan, cost, unpinned = candidates[k]
    plan.notes.append(choice.line())
    taken = written[k] if judged[chosen].arena else replace(written[k], mem_arena=False)
    return Planned(plan, result=unpinned, written=taken, cost=cost, module=choice)


class _Trials:
    """The plans of one artifact trained in turn: as written until one passes (plan k),
    then plans 0..k (every plan where none passed) with their shapes hidden from ORT's
    memory planning (``Writer.model``'s ``unplanned``), and one so written that passes
    untuned only, lower there than the best so far, once more with its dimensions that
    move alike sharing a symbol; the lowest untuned peak of all that pass is taken
    (``lower``). ORT's memory pattern sizes its block from the tensors it can size before
    the run, and the BFC arena gives the block a whole power-of-two region: hiding a
    rewrite's tensors from it can lower a passing plan's peak as well as a failing one's,
    and a plan that fails as written can pass so (zoo unet: none of its 5 plans passes as
    written, all 5 pass unplanned, 0.71x to 0.95x the original's untuned peak). A symbol per dimension turns
    buffer reuse off as well, which the settings ckpt records keep on: one symbol per size
    gives it back (zoo frozen_backbone)."""

    def __init__(self, a: Analysis, candidates: list[Candidate], writer: Writer, tmp: Path, run: TrialRun) -> None:
        self.a, self.candidates, self.writer, self.tmp = a, candidates, writer, tmp
        self.model_path, self.files, self.feeds, self.worker, self.original = run
        self.judged: list[ModuleJudged] = []
        self.written: dict[int, RewriteResult] = {}
        self.originals: dict[str, ModuleRun] = {}  # the original's runs, by the settings they ran under

    def reference(self, settings: dict[str, Any]) -> ModuleRun:
        key = repr(sorted(settings.items()))
        if key not in self.originals:
            self.originals[key] = run_module(self.model_path, self.files, self.feeds, settings, self.worker, STEPS)
        return self.originals[key]

    def trial(self, i: int, unplanned: bool, shared: bool = False, arena: bool = True) -> ModuleJudged | None:
        """Plan ``i`` trained (written unplanned, with shared symbols, or not; recorded with
        the CPU arena or without); None where unplanned hides nothing."""
        plan, cost, unpinned = self.candidates[i]
        if i not in self.written:
            # Pinned with the waits: the untuned session runs ORT's DEFAULT order (zoo unet's
            # default unplanned: 71.6 MiB without them, 63.6 with, the original 89.3).
            self.written[i] = self.writer.result(pinned(self.a, unpinned if unpinned is not None
                                                        else rewrite(self.a, plan, False), waits=True))
        result = self.written[i] if arena else replace(self.written[i], mem_arena=False)
        path = self.tmp / (f"plan{i}{'_unplanned' if unplanned else ''}{'_shared' if shared else ''}"
                           f"{'' if arena else '_noarena'}.onnx")
        trained = _train(lambda: self.writer.save(self.a, result, plan, path, (unplanned, shared)), path,
                         self.files, self.feeds, self.worker, cost, self.original, self.reference)
        if trained is None:
            return None  # nothing to hide: the file has no symbolic dimension
        judged = replace(trained, unplanned=unplanned, shared=shared, plan=i, arena=arena)
        self.judged.append(judged)
        return judged

    def below(self, j: ModuleJudged, best: int | None) -> bool:
        """``j``'s untuned peak is below trial ``best``'s (any is, where there is none)."""
        return best is None or (j.peak_bytes or 0) < (self.judged[best].peak_bytes or 0)

    def lowest(self, best: int | None) -> int | None:
        """The last trial where it passes lower than ``best`` (``lower``), else ``best``."""
        j, limit = self.judged[-1], self.original.peak_bytes
        if j.accepted(limit) and self.lower(j, best):
            return len(self.judged) - 1
        return best

    def lower(self, j: ModuleJudged, best: int | None) -> bool:
        """``j``'s untuned peak is below trial ``best``'s, or within ``UNTUNED_TRADE`` of the
        original's untuned peak (or a Module session's measurement noise) of it and ``j``'s
        peak under its settings is below: two trials that pass that close untuned are told
        apart by their settings (zoo unet: its descended plan 63.37 MiB untuned, 51.70 under
        its settings; the sqrt plan 63.43 and 63.74)."""
        b = self.judged[best] if best is not None else None
        near = max(module_noise(self.original.peak_bytes), int(UNTUNED_TRADE * (self.original.peak_bytes or 0)))
        if b is not None and abs((j.peak_bytes or 0) - (b.peak_bytes or 0)) <= near:
            return (j.peak_bytes_settings or 0) < (b.peak_bytes_settings or 0)
        return self.below(j, best)

    def run(self) -> tuple[list[ModuleJudged], dict[int, RewriteResult], int | None]:
        """The plans judged, the rewrites by plan, and the index of the one taken in the first."""
        limit, passed = self.original.peak_bytes, None
        for i in range(len(self.candidates)):
            if self.trial(i, False).accepted(limit):  # type: ignore[union-attr]
                passed = len(self.judged) - 1
                break
        best = passed
        for i in range(len(self.candidates) if passed is None else self.judged[passed].plan + 1):
            j = self.trial(i, True)
            if j is None:
                break
            best = self.lowest(best)
            if (not j.accepted(limit) and j.untuned_accepted(limit)
                    and self.below(j, best)):
                self.trial(i, True, shared=True)
                best = self.lowest(best)
        return self.judged, self.written, self.arena_off(best)

    def arena_off(self, best: int | None) -> int | None:
        """``best``, or the trial that passes untuned only at the lowest peak there, below
        ``best``'s, trained once more recorded with ORT's CPU arena off, where that passes;
        then the trial taken, so recorded once more, where that is lower under its settings
        (the untuned session keeps the arena either way; zoo diffusion's default: 93.7 MiB
        under its settings with the arena, 69.0 without, the original untuned 141.4).
        The arena (BFC, regions growing by powers of two) keeps the pages of every chunk it
        ever handed out: a rewrite that allocates in another order can touch more of them
        than the original under ckpt's settings while holding fewer bytes (zoo lstm's
        default, reuse off: 10.46 MiB against the original's 10.29 with the arena, 9.62-9.83
        against 10.00-10.08 without; buffer reuse on is higher on both sides)."""
        limit = self.original.peak_bytes
        near = [j for j in self.judged if j.untuned_accepted(limit) and not j.accepted(limit) and j.arena
                and self.below(j, best)]
        if near:
            j = min(near, key=lambda t: t.peak_bytes or 0)
            self.trial(j.plan, j.unplanned, j.shared, arena=False)
            best = self.lowest(best)
        taken = self.judged[best] if best is not None else None
        if taken is not None and taken.arena:
            self.trial(taken.plan, taken.unplanned, taken.shared, arena=False)
            best = self.lowest(best)
        return best


def _train(save: Callable[[], bool], path: Path, files: dict[str, str], feeds: Path, worker: WorkerOptions,
           cost: PlanCost, original: ModuleRun, reference: Callable[[dict[str, Any]], ModuleRun]
           ) -> ModuleJudged | None:

    """The model ``save()`` writes to ``path``, trained untuned and under its recorded
    settings; ``reference(settings)``: the original's run under those settings. None where
    ``save()`` wrote nothing."""
    from ..io.session import recorded_settings

    try:
        if not save():
            return None
        settings = recorded_settings(path)
        # three children at once: each measures its own process peak, and no figure of a
        # trial is a time
        untuned, tuned, base = side_by_side(lambda: run_module(path, files, feeds, None, worker, STEPS),
                                            lambda: run_module(path, files, feeds, settings, worker, STEPS),
                                            lambda: reference(settings))
    except RunFailed as e:
        if e.kind == "timeout":
            raise
        return ModuleJudged(cost.recompute_flops, cost.peak_bytes, None, False, f"{e.kind}: {e.message}")
    except CkptError as e:
        return ModuleJudged(cost.recompute_flops, cost.peak_bytes, None, False, str(e))
    return ModuleJudged(cost.recompute_flops, cost.peak_bytes, untuned.peak_bytes,
                        untuned.losses_hex == original.losses_hex, peak_bytes_settings=tuned.peak_bytes,
                        identical_settings=tuned.losses_hex == base.losses_hex,
                        original_peak_settings=base.peak_bytes)


__all__ = ["ModuleChoice", "ModuleJudged", "Writer", "judged_by_training", "judged_in_module"]
