"""What ckpt knows about ONNX ops, in one table that every stage reads.

The memory classes (views, in-place) are ORT's CPU kernels as measured on ORT 1.31; the
memory model is checked against ORT's profiler with them (tests/test_memory_property.py),
so an op moves between classes only with a new measurement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .graph import Node

# Recomputing these would draw different numbers than the forward pass did.
RANDOM_OPS = frozenset({"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                        "Bernoulli", "Multinomial"})

# The CPU kernels of these ops alias output 0 to input 0 (measured on ORT 1.31).
VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})

# The CPU kernels of these ops may write output 0 into input 0 (``MayInplace(0, 0)``;
# measured on ORT 1.31: not Exp, Neg, binary ops, Dropout, Expand, Transpose, ScatterND).
IN_PLACE_OPS = frozenset({"ScatterElements", "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Sigmoid",
                          "HardSigmoid", "Tanh", "Softplus", "Softsign", "Clip", "Shrink", "ThresholdedRelu",
                          "Softmax", "LogSoftmax", "Cast"})

# These read only their input's shape, not its data: such readers stay on the original
# tensor (a copy is not needed for them), and a backward read by them alone keeps nothing.
SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})

# Under PRIORITY_BASED, ORT runs these as soon as they are ready, before anything else.
HIGH_PRIORITY_OPS = frozenset({"Shape", "Size"})

# Compute-bound ops: ``balanced`` never recomputes their outputs.
EXPENSIVE_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "FusedMatMul", "Attention",
                           "MultiHeadAttention", "MatMulInteger", "QLinearMatMul", "QLinearConv"})

# Ops whose FLOPs count in the matmul-only FLOP notion (``NodeCost.matmul_flops``): what
# PyTorch's partitioner weighs, for the min-cut's exact mode and the peer comparison.
MATMUL_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "Conv", "ConvTranspose", "Einsum", "MatMulInteger"})

# ORT 1.31 computes shape values from Shape and Size through these ops only, and through
# scalar arithmetic (onnxruntime/core/graph/data_propagation/; measured: not through Slice,
# Concat, Reshape or arithmetic on whole shapes).
ORT_FOLDABLE = frozenset({"Shape", "Size", "Constant", "Gather", "Squeeze", "Unsqueeze"})
ORT_SCALAR_FOLDABLE = frozenset({"Add", "Sub", "Mul", "Div"})

# Standard ops with subgraph attributes (nodes of other domains are looked into as well).
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def is_recomputable(node: Node) -> bool:
    """Deterministic, standard-domain and without subgraphs: safe to run twice."""
    return node.op_type not in RANDOM_OPS and not node.has_subgraph and node.domain in ("", "ai.onnx")
