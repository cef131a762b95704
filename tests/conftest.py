import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("NO_COLOR", "1")


@pytest.fixture
def chain_path(tmp_path):
    import onnx
    from chain import chain_model

    path = tmp_path / "chain.onnx"
    onnx.save(chain_model(), path)
    return path
