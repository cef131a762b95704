"""The plan stage: ``Analysis -> Plan`` (which forward nodes are recomputed)."""

from __future__ import annotations

from pathlib import Path

from ..analysis import Analysis
from ..errors import UsageError
from .decision import region_decisions
from .plan import Plan, Region, read_plan_file
from .regions import (default_regions, layer_regions, region_from_boundary, regions_by_scope, regions_from_patterns,
                      regions_from_plan, sqrt_regions)


def choose_plan(a: Analysis, patterns: list[str] | None = None, scope: str | None = None,
                boundaries: list[str] | None = None, plan_file: Path | None = None) -> Plan:
    """Regions from whichever way the user marked them; the default when none is given."""
    chosen = [bool(patterns), bool(scope), bool(boundaries), plan_file is not None]
    if sum(chosen) > 1:
        raise UsageError("use one of --region, --regions-by-scope, --boundary and --plan at a time")
    if patterns:
        return regions_from_patterns(a, patterns)
    if scope:
        return regions_by_scope(a, scope)
    if boundaries:
        regions = [r for b in boundaries for r in region_from_boundary(a, b).regions]
        return Plan(regions, "boundary", decisions=region_decisions(a, regions))
    if plan_file is not None:
        return regions_from_plan(a, read_plan_file(plan_file))
    return default_regions(a)


__all__ = ["Plan", "Region", "choose_plan", "default_regions", "layer_regions", "sqrt_regions",
           "regions_by_scope", "regions_from_patterns", "region_from_boundary", "regions_from_plan"]
