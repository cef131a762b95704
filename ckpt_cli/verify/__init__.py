"""The verify stage: run models on ONNX Runtime in child processes and judge a rewrite.

- ``stage``: ``check_files`` (paths + predictions -> ``CheckFigures`` with a verdict)
- ``figures``: the records ``stage`` fills and ``rules`` judges (``CheckFigures``, ``Finding``)
- ``rules``: the verdict, each rule a function of the figures to its ``Finding``s
- ``driver``: one child process per measured model (``run_model``, ``check_pair`` -> ``PairRun``)
- ``worker``: the standalone script a child runs (numpy + onnxruntime only)
- ``module_runs``: an ORT training artifact trained by the Module API (``module_child``, a
  standalone script as ``worker``), untuned and under the rewrite's settings
- ``compare``: outputs bit for bit, executed order against file order
- ``feeds``: generated or given inputs
- the session settings measured and recommended: ``ort/settings.py`` (re-exported here)
"""

from .compare import DEFAULT_ATOL, DEFAULT_RTOL, compare_outputs, order_check
from ..options import DEFAULT_TIMEOUT_S
from .driver import (PairOptions, PairRun, WorkerOptions, check_pair, file_node_order,
                     probe_provider, resolve_provider, run_model)
from ..ort.settings import (ckpt_session_settings, ort_default_session_settings, settings_for,
                       settings_snippet)
from .figures import CheckFigures, Measurement
from .stage import Prediction, check_files

__all__ = [
    "CheckFigures", "Measurement", "Prediction", "check_files", "check_pair", "run_model", "PairOptions", "PairRun",
    "WorkerOptions", "compare_outputs",
    "order_check", "file_node_order", "probe_provider", "resolve_provider", "ckpt_session_settings",
    "ort_default_session_settings", "settings_for", "settings_snippet", "DEFAULT_RTOL", "DEFAULT_ATOL",
    "DEFAULT_TIMEOUT_S",
]
