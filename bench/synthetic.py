"""The synthetic transformer training graphs of the speed rows, as ``python -m bench.synthetic``.

The generator is ``tests/fixtures/synthetic.py``: the tests build their graphs with it too,
and the tests import nothing from bench/.
"""

from __future__ import annotations

import sys

from tests.fixtures.synthetic import build_transformer, estimate_nodes, main, save_transformer

__all__ = ["build_transformer", "estimate_nodes", "main", "save_transformer"]

if __name__ == "__main__":
    sys.exit(main())
