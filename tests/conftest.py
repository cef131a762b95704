import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
sys.path.insert(0, str(Path(__file__).resolve().parent))
# Model builders and measuring helpers the tests share (chain, randgraph, ort_profile).
sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
os.environ.setdefault("NO_COLOR", "1")


@pytest.fixture
def chain_path(tmp_path):
    import onnx
    from chain import chain_model

    path = tmp_path / "chain.onnx"
    onnx.save(chain_model(), path)
    return path


def pytest_collection_modifyitems(config, items):
    """Every test that runs onnxruntime-training (the ``training_python`` fixture, directly
    or through another fixture) is marked ``ort_training``: ``make test-ort-training`` runs
    them beside the artifact zoo, ``make test`` the rest."""
    for item in items:
        if "training_python" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ort_training)


# Skips that say something about the machine, not about the code. Under CI (CI=true) any
# other skip fails the run: a test that quietly stops running guards nothing.
EXPECTED_SKIPS = ("root writes into read-only folders", "a GPU is available here", "a CUDA provider works here",
                  "a usable GPU is present")


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("CI") != "true" or hasattr(session.config, "workerinput"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    unexpected = [r for r in skipped if not any(reason in str(r.longrepr) for reason in EXPECTED_SKIPS)]
    if unexpected:
        for r in unexpected:
            reporter.write_line(f"unexpected skip under CI: {r.nodeid}: {r.longrepr}")
        session.exitstatus = 1
