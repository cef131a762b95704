"""Judge an ORT training artifact's default in the session its users run: the Module API, untuned.

Users of ``generate_artifacts``' output train through ``Module`` + ``Optimizer`` with ORT's
defaults: ORT_ENABLE_ALL's fusions, DEFAULT order, the memory pattern, buffer reuse and the
arena. ckpt's memory model does not predict that session's process peak well enough to tell
a rewrite 0.9x of the original from one 1.1x (the fusions and the pattern's block move it
both ways), and a fusion that treats a recompute copy unlike its original rounds the loss
differently. With an interpreter that has onnxruntime-training (``--python``), the default's
plan and the plans with less recompute along its front are trained there instead, a few
steps each from the artifact's checkpoint, lowest predicted peak first, untuned and under
the settings ckpt records for it (the original too, under the same settings): the first
whose process peak is not above the original's untuned, nor under its settings above the
original's in either session, with the original's losses bit for bit in both, is written.
When none is, the same plans are trained again written with their tensors' shapes hidden
from ORT's memory planning (``io/written.py``'s ``unplanned_shapes``: the memory pattern and
buffer reuse off tensor by tensor, which a Module's user session otherwise keeps on), and the
first that passes is written so; when none does either, the graph is written unchanged, with
the figures in one line.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import onnx

from ..analysis import Analysis
from ..errors import CkptError, RunFailed
from ..io.save import save_model
from ..planning.budget import Planned
from ..rewrite import RewriteResult, pinned, rewrite
from ..rewrite.mem_pattern import is_ort_artifact
from ..units import human_bytes
from .driver import WorkerOptions
from .module_runs import STEPS, artifact_files, run_module
from .stage import prepare_feeds


@dataclass(frozen=True)
class Writer:
    """How the command writes a rewrite: ``finish`` turns the pinned rewrite into the one
    written, ``model(result, plan)`` makes its file's model (metadata and the shapes of
    symbolic dimensions included: the Module's session plans its memory from them), so
    what is trained is byte for byte what would be written. ``model(result, plan, True)``:
    the same with its tensors' shapes hidden from ORT's memory planning
    (``io/written.py``'s ``unplanned_shapes``), or None where nothing is hidden."""

    finish: Callable[[RewriteResult], RewriteResult] | None
    model: Callable[..., onnx.ModelProto | None]

    def result(self, result: RewriteResult) -> RewriteResult:
        return self.finish(result) if self.finish is not None else result

    def save(self, a: Analysis, result: RewriteResult, plan, path: Path, unplanned: bool = False) -> bool:
        """Writes the model to ``path``; False (nothing written) where ``unplanned`` hides nothing."""
        source = a.graph.path.parent if a.graph.path is not None else None
        model = self.model(result, plan, unplanned)
        if model is None:
            return False
        save_model(model, path, source_dir=source, force=True)
        return True

    def written(self, result: RewriteResult, plan, unplanned: bool = False) -> onnx.ModelProto:
        """The model the command writes: with ``unplanned``, hidden where anything is."""
        model = self.model(result, plan, unplanned) if unplanned else None
        model = model if model is not None else self.model(result, plan)
        assert model is not None
        return model


# Each plan tried is two training children (a few seconds on the zoo's models): the
# default's plan and at most this many with less recompute.
MAX_FALLBACKS = 5


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

    @property
    def identical(self) -> bool:
        return self.identical_untuned and self.identical_settings

    def accepted(self, original_peak: int) -> bool:
        """Trained with the original's losses, and not above the original's peak untuned,
        nor under its settings above the original's untuned or under the same settings."""
        peak, settings_peak = self.peak_bytes, self.peak_bytes_settings
        if self.error is not None or not self.identical or peak is None or settings_peak is None:
            return False
        settings_limit = min(original_peak, self.original_peak_settings or original_peak)
        return peak <= original_peak and settings_peak <= settings_limit

    def to_json(self) -> dict:
        return {"recompute_flops": self.recompute_flops, "settings_peak_bytes": self.settings_peak_bytes,
                "peak_bytes": self.peak_bytes, "peak_bytes_under_settings": self.peak_bytes_settings,
                "original_peak_bytes_under_settings": self.original_peak_settings,
                "losses_identical": self.identical, "losses_identical_untuned": self.identical_untuned,
                "losses_identical_under_settings": self.identical_settings, "unplanned_shapes": self.unplanned,
                "error": self.error}


@dataclass(frozen=True)
class ModuleChoice:
    """The original's measured untuned peak, the plans trained (the default's first), and
    the one taken (None: none, the graph is written unchanged)."""

    original_peak_bytes: int
    judged: tuple[ModuleJudged, ...]
    chosen: int | None
    steps: int
    planned: int = 1  # how many plans were tried as written (the unplanned writings follow them)

    @property
    def unplanned(self) -> bool:
        """Whether the plan taken is written with its shapes hidden from ORT's memory planning."""
        return self.chosen is not None and self.judged[self.chosen].unplanned

    def ratio(self, i: int) -> float:
        return (self.judged[i].peak_bytes or 0) / max(1, self.original_peak_bytes)

    def line(self) -> str:
        head = (f"trained by the Module API untuned ({self.steps} steps), the original's process peak is "
                f"{human_bytes(self.original_peak_bytes)}")
        if self.chosen is None:
            return head + (f"; none of the {len(self.judged)} plans tried stays at or below it with the "
                           f"original's losses bit for bit ({self._why_not()}): the graph is written unchanged")
        taken = self.judged[self.chosen]
        k = self.chosen % max(1, self.planned)  # the plan's place among those tried
        which = "the default's plan" if k == 0 else f"plan {k + 1} of the front (less recompute)"
        if taken.unplanned:
            which += (", its tensors declared by symbols of their own (out of ORT's memory pattern and buffer "
                      "reuse; with the plain writing, none of the plans passes),")
        settings = (taken.peak_bytes_settings or 0) / max(1, self.original_peak_bytes)
        return (head + f"; {which} measures {human_bytes(taken.peak_bytes or 0)} there ({self.ratio(self.chosen):.2f}x)"
                f" and {human_bytes(taken.peak_bytes_settings or 0)} under ckpt's settings ({settings:.2f}x), "
                "with the same losses")

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

    def to_json(self) -> dict:
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


def _candidates(planned: Planned) -> list[tuple]:
    return [(planned.plan, planned.cost, planned.result), *planned.fallbacks[:MAX_FALLBACKS]]


def judged_in_module(a: Analysis, planned: Planned, feeds_model, worker: WorkerOptions,
                     writer: Writer) -> Planned:
    """``planned`` (the default of an artifact), or the first plan of its front that the
    Module API trains at no more than the original's untuned peak with the same losses,
    with the choice recorded; ``planned`` as it is where nothing can be judged."""
    if planned.user or planned.budget is not None or planned.plan is None or planned.cost is None:
        return planned
    artifact = _artifact(a)
    if artifact is None:
        return planned
    model_path, files = artifact
    candidates = _candidates(planned)
    # every plan as written first; then, where none passes, the same plans with their
    # shapes hidden from ORT's memory planning (``Writer.model``'s ``unplanned``)
    tries = [(i, False) for i in range(len(candidates))] + [(i, True) for i in range(len(candidates))]
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
        judged: list[ModuleJudged] = []
        written: dict[int, RewriteResult] = {}
        originals: dict[str, dict] = {}  # the original's runs, by the settings they ran under
        chosen = None

        def reference(settings: dict) -> dict:
            key = repr(sorted(settings.items()))
            if key not in originals:
                originals[key] = run_module(model_path, files, feeds, settings, worker, STEPS)
            return originals[key]

        for i, unplanned in tries:
            plan, cost, unpinned = candidates[i]
            if i not in written:
                written[i] = writer.result(pinned(a, unpinned) if unpinned is not None else rewrite(a, plan, True))
            result = written[i]
            path = Path(tmp) / f"plan{i}{'_unplanned' if unplanned else ''}.onnx"
            if unplanned and not writer.save(a, result, plan, path, True):
                break  # nothing to hide: the file has no symbolic dimension
            judged.append(replace(_train(lambda: writer.save(a, result, plan, path, unplanned), path, files, feeds,
                                         worker, cost, original, reference), unplanned=unplanned))
            if judged[-1].accepted(original["peak_bytes"]):
                chosen = i
                break
    choice = ModuleChoice(original["peak_bytes"], tuple(judged), None if chosen is None else len(judged) - 1,
                          STEPS, len(candidates))
    if chosen is None:
        return replace(planned, module=choice)
    plan, cost, unpinned = candidates[chosen]
    plan.notes.append(choice.line())
    return Planned(plan, result=unpinned, written=written[chosen], cost=cost, module=choice)


def _train(save: Callable[[], object], path: Path, files: dict, feeds: Path, worker: WorkerOptions,
           cost, original: dict, reference: Callable[[dict], dict]) -> ModuleJudged:
    """The model ``save()`` writes to ``path``, trained untuned and under its recorded
    settings; ``reference(settings)``: the original's run under those settings."""
    from ..ort.session import recorded_settings

    try:
        save()
        untuned = run_module(path, files, feeds, None, worker, STEPS)
        settings = recorded_settings(path)
        tuned = run_module(path, files, feeds, settings, worker, STEPS)
        base = reference(settings)
    except RunFailed as e:
        if e.kind == "timeout":
            raise
        return ModuleJudged(cost.recompute_flops, cost.peak_bytes, None, False, f"{e.kind}: {e.message}")
    except CkptError as e:
        return ModuleJudged(cost.recompute_flops, cost.peak_bytes, None, False, str(e))
    return ModuleJudged(cost.recompute_flops, cost.peak_bytes, untuned["peak_bytes"],
                        untuned["losses_hex"] == original["losses_hex"], peak_bytes_settings=tuned["peak_bytes"],
                        identical_settings=tuned["losses_hex"] == base["losses_hex"],
                        original_peak_settings=base["peak_bytes"])


__all__ = ["ModuleChoice", "ModuleJudged", "Writer", "judged_by_training", "judged_in_module"]
