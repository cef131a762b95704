"""What ckpt knows about ONNX ops, in one table that every stage reads.

The memory classes (views, in-place) are ORT's CPU kernels as measured on ORT 1.31; the
memory model is checked against ORT's profiler with them (tests/test_memory_property.py),
so an op moves between classes only with a new measurement.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

    from .graph import Node

# ONNX Runtime's training and contrib schemas: domain and whether the op draws random
# numbers (a ``seed`` attribute), from orttraining/core/graph/training_op_defs.cc (1.19:
# ``TrainableDropout`` in the ONNX domain) and core/graph/contrib_ops/contrib_defs.cc (the
# Dropout fusions). ATenOp and PythonOp run arbitrary code: counted as random.
ORT_TRAINING_SCHEMAS: dict[str, tuple[str, bool]] = {
    **dict.fromkeys(("AveragePoolGrad", "MaxPoolGrad", "SinGrad", "ReshapeGrad", "GatherND",
                     "SparseSoftmaxCrossEntropy", "SparseSoftmaxCrossEntropyGrad", "HorovodAllReduce",
                     "HorovodBarrier"), ("", False)),
    "TrainableDropout": ("", True),
    **dict.fromkeys(("ReluGrad", "SoftmaxGrad", "SoftmaxGrad_13", "LogSoftmaxGrad", "LogSoftmaxGrad_13", "ConvGrad",
                     "GatherGrad", "GatherElementsGrad", "DivGrad", "SGDOptimizer", "AdamOptimizer",
                     "AdamWOptimizer", "LambOptimizer", "InPlaceAccumulator", "InPlaceAccumulatorV2",
                     "ZeroGradient", "GatherNDGrad", "SoftmaxCrossEntropy", "SoftmaxCrossEntropyGrad",
                     "SoftmaxCrossEntropyLossGrad", "SoftmaxCrossEntropyLossInternal",
                     "SoftmaxCrossEntropyLossInternalGrad", "NcclAllReduce", "NcclAllGather",
                     "NcclReduceScatter", "AdasumAllReduce", "ReduceSumTraining", "SplitTraining",
                     "ConcatTraining", "DropoutGrad", "TrainableDropoutGrad", "BitmaskDropoutGrad",
                     "BroadcastGradientArgs", "GistBinarizeEncoder", "GistBinarizeDecoder", "GistPack1Encoder",
                     "GistPack1Decoder", "GistPack8Encoder", "GistPack8Decoder", "GistPack16Encoder",
                     "GistPack16Decoder", "GistPackMsfp15Encoder", "GistPackMsfp15Decoder", "SummaryScalar",
                     "SummaryHistogram", "SummaryMerge", "SummaryText", "GeluGrad", "FastGeluGrad",
                     "BiasGeluGrad_dX", "BiasFastGeluGrad_dX", "LayerNormalizationGrad",
                     "SimplifiedLayerNormalizationGrad", "InvertibleLayerNormalizationGrad",
                     "BatchNormalizationGrad", "BatchNormInternal", "Group", "PassThrough", "IsFinite", "All",
                     "IsAllFinite", "MixedPrecisionScale", "Scale", "View", "ReduceAllL2", "Send", "Recv",
                     "MegatronF", "MegatronG", "SliceGrad", "RecordEvent", "WaitEvent", "YieldOp", "ATenOpGrad",
                     "PythonOpGrad", "LSTMTraining", "LSTMGrad", "GRUTraining", "GRUGrad",
                     # the names onnxruntime-training 1.19.2 loads a com.microsoft node of (each
                     # identifier in its library tried as a one-node model) beyond the above
                     "BatchScale", "ConvTransposeGrad", "FakeQuant", "FakeQuantGrad", "FlattenAndUnpad",
                     "InplaceClipGradNorm", "LeakyReluGrad", "NegativeLogLikelihoodLossInternal",
                     "NegativeLogLikelihoodLossInternal2", "PadAndUnflatten", "QuickGeluGrad", "ResizeGrad",
                     "SGDOptimizerV2", "ScaledSum", "ShrunkenGather", "SigmoidGrad", "SoftmaxDropoutGrad",
                     "TanhGrad"),
                    ("com.microsoft", False)),
    **dict.fromkeys(("BiasDropout", "BitmaskDropout", "BitmaskBiasDropout", "BiasSoftmaxDropout", "ATenOp",
                     "PythonOp"), ("com.microsoft", True)),
}

# Recomputing these would draw different numbers than the forward pass did.
RANDOM_OPS = frozenset({"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                        "Bernoulli", "Multinomial"} | {op for op, (_, rand) in ORT_TRAINING_SCHEMAS.items() if rand})

# The CPU kernels of these ops alias output 0 to input 0 (measured on ORT 1.31).
VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})

# ONNX Runtime 1.25 to 1.30 (measured on each; 1.24 and 1.31 load it) fail to load a graph,
# at every optimization level above none, where a Reshape whose shape is computed (ckpt's
# guards and fresh-tensor views) feeds one of these whose output shape ORT knows: ReshapeFusion
# merges the two and loses the computed shape's edge ("Attempting to get index by a name which
# does not exist ... _new_reshape"). One of these in front of such a Reshape loads, and so does
# a guard feeding a fresh view (whose shape ORT cannot know).
RESHAPE_FUSED_OPS = VIEW_OPS - {"Identity"}

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

# Copies ORT places between a GPU provider and CPU-placed nodes. They are ORT's own ops
# (not ONNX), written into an optimized file and inserted again whenever ORT loads one.
DEVICE_COPY_OPS = frozenset({"MemcpyToHost", "MemcpyFromHost"})

# Inputs that GPU kernels read from host memory (shapes, axes, starts). A guard in front of
# one runs on the device, and ORT then copies its output back (a Memcpy node it adds with
# the highest index, which delays the reader under PRIORITY_BASED): never guard these.
HOST_INPUT_SLOTS: dict[str, frozenset[int]] = {
    "ConstantOfShape": frozenset({0}), "Reshape": frozenset({1}), "Expand": frozenset({1}),
    "Tile": frozenset({1}), "Slice": frozenset({1, 2, 3, 4}), "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}), "Split": frozenset({1}), "Pad": frozenset({1, 2, 3}), "TopK": frozenset({1}),
    "Range": frozenset({0, 1, 2}), "OneHot": frozenset({1}), "Resize": frozenset({1, 2, 3}),
    "Upsample": frozenset({1}), "ReduceSum": frozenset({1}), "ReduceMean": frozenset({1}),
    "ReduceMax": frozenset({1}), "ReduceMin": frozenset({1}), "ReduceProd": frozenset({1}),
    "ReduceL2": frozenset({1}), "ReduceSumSquare": frozenset({1}), "ReduceLogSumExp": frozenset({1}),
}

# Standard ops with subgraph attributes (nodes of other domains are looked into as well).
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


# Deterministic ONNX Runtime contrib ops (com.microsoft) that ORT's graph optimizations make
# from standard ones (fusions): running one twice gives the same bits, like the ops it replaced.
CONTRIB_DOMAIN = "com.microsoft"
DETERMINISTIC_CONTRIB_OPS = frozenset({
    "FusedMatMul", "FusedGemm", "FusedConv", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd",
    "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "LayerNormalization",
    "SimplifiedLayerNormalization", "BiasSoftmax", "Softmax", "Sigmoid", "Relu", "Tanh"})
# ORT training's forms of Concat and Split (an artifact's gradient builder writes them in
# place of the standard ops; the extra output of ConcatTraining is the input lengths).
DETERMINISTIC_TRAINING_OPS = frozenset({"ConcatTraining", "SplitTraining"})

# Ops whose output dimensions all come from their data inputs' dimensions (onnx shape
# inference leaves them unknown when those are unknown). Others (Expand, Reshape to a
# constant, ConstantOfShape, ...) take their shape from values, so guards would not help.
SHAPE_FROM_INPUTS_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Equal", "Less", "Greater", "And", "Or", "Not",
    "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Abs", "Erf", "Tanh", "Sigmoid", "Relu", "LeakyRelu", "Gelu",
    "Softmax", "LogSoftmax", "LayerNormalization", "MatMul", "Gemm", "Transpose", "Concat", "Cast",
    "ReduceSum", "ReduceMean", "ReduceMax", "Gather", "Slice", "ScatterND", "ScatterElements", "Clip",
})

# Of those, the ops whose output shape ONNX infers only when every input's shape is known
# (broadcasting, MatMul, Concat, Gather; checked with onnx.shape_inference): hiding one
# input's shape hides the output's. Not Gemm: one known input gives it a dimension.
ALL_INPUT_SHAPES_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Equal", "Less", "Greater", "And", "Or",
    "MatMul", "Concat", "Gather"})


# ORT training's CPU pooling gradients (MaxPoolGrad, AveragePoolGrad, onnxruntime-training
# 1.19.2) size their output dX from the shape the graph declares for it, read in the kernel's
# constructor: with no declared shape the constructor dereferences a null shape and the
# process dies (SIGSEGV) while the session is made. MaxPoolGrad takes dX's first dimension
# from dY at run time and every other one from the declaration; a symbolic dimension reads 0.
SHAPE_FROM_DECLARATION_OPS = frozenset({"MaxPoolGrad", "AveragePoolGrad"})


def is_recomputable(node: Node) -> bool:
    """Deterministic, without subgraphs, and a standard op or one of ORT's deterministic
    fused contrib ops: safe to run twice."""
    if node.op_type in RANDOM_OPS or node.has_subgraph:
        return False
    if node.domain in ("", "ai.onnx"):
        return True
    return node.domain == CONTRIB_DOMAIN and (node.op_type in DETERMINISTIC_CONTRIB_OPS
                                              or node.op_type in DETERMINISTIC_TRAINING_OPS)


_ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip", "HardSigmoid", "Elu", "Selu", "Softplus")
# Producer -> consumer edges that ONNX Runtime's CPU graph fusions (up to ORT_ENABLE_ALL)
# merge into one node: GemmTransposeFusion, MatmulTransposeFusion, MatMulAddFusion,
# MatMulScaleFusion, BiasGeluFusion, SkipLayerNormFusion, GemmActivationFusion,
# ConvActivationFusion, ConvAddFusion, ConvMulFusion, ConvBNFusion, DivMulFusion,
# FuseReluClip, NotWhereFusion, and the TransposeOptimizer (two Transposes cancel or merge).
# A fused kernel rounds differently from the ops it replaces (FusedMatMul with transB against
# a MatMul after a Transpose): a node put on such an edge, or a reader added to the
# producer's output (the fusions want it read once), makes ORT compute other bits.
ORT_FUSED_EDGES: frozenset[tuple[str, str]] = frozenset(
    {("Transpose", op) for op in ("MatMul", "FusedMatMul", "Gemm", "Transpose")}
    | {("Gemm", "Transpose"), ("MatMul", "Add"), ("Add", "Gelu"), ("Add", "FastGelu")}
    | {(a, b) for a in ("MatMul", "FusedMatMul") for b in ("Mul", "Div")} | {("Mul", "MatMul"), ("Div", "MatMul")}
    | {("Add", "LayerNormalization"), ("Add", "SimplifiedLayerNormalization")}
    | {(p, act) for p in ("Gemm", "Conv") for act in _ACTIVATIONS}
    | {("Conv", op) for op in ("Add", "Mul", "BatchNormalization")}
    | {("Div", "Mul"), ("Relu", "Clip"), ("Not", "Where")})
# Op chains that ORT's fusions of decomposed functions match whole (GeluFusion,
# LayerNormFusion, SimplifiedLayerNormFusion, FastGeluFusion, QuickGeluFusion): their edges
# (Mul -> Mul, Add -> Mul, ...) are common elsewhere, so an edge counts only inside the chain.
ORT_FUSED_CHAINS: tuple[tuple[str, ...], ...] = (
    ("Div", "Erf", "Add", "Mul", "Mul"), ("Mul", "Erf", "Add", "Mul", "Mul"),
    ("ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"),
    ("ReduceMean", "Sub", "Div", "Mul", "Add"),
    ("Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"), ("Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul"),
    ("Mul", "Mul", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul"), ("Mul", "Sigmoid", "Mul"))


def ort_may_fuse(producer_op: str, consumer_op: str) -> bool:
    """Whether ORT's CPU fusions may merge a ``producer_op`` node into its ``consumer_op`` reader."""
    return (producer_op, consumer_op) in ORT_FUSED_EDGES


def ort_kernel_defects(nodes: Iterable[onnx.NodeProto],
                       declared: Mapping[str, onnx.ValueInfoProto] | None = None) -> list[str]:
    """ONNX Runtime kernels in ``nodes`` known to compute wrongly or crash, one line each;
    ``declared``: the graph's value_info and outputs by name (the pooling gradients read
    theirs, ``SHAPE_FROM_DECLARATION_OPS``). The CPU ConvGrad of onnxruntime-training 1.19.2
    over one spatial axis with ``group`` above 1 writes past its buffers: a one-node model of
    it, depthwise included, aborts the process with the arena off, and with the arena and the
    memory pattern on the overflow lands in other tensors' memory. The same node over two
    axes runs clean."""
    nodes = list(nodes)
    out = _pooling_declaration_defects(nodes, declared or {})
    grouped = [n for n in nodes if grouped_1d_conv_grad(n)]
    if grouped:
        out.append(f"{len(grouped)} grouped 1-D ConvGrad node(s) (group > 1): ONNX Runtime training 1.19.2's CPU "
                   "kernel writes past its buffers there (a one-node model of it crashes the process with the "
                   "arena off); losses and gradients of this model on that build are not trustworthy")
    return out


# The ops ``ort_kernel_defects`` judges (few in any graph: the rest need not be passed).
KERNEL_DEFECT_OPS = SHAPE_FROM_DECLARATION_OPS | {"ConvGrad"}


def declarations(graph: onnx.GraphProto) -> dict[str, onnx.ValueInfoProto]:
    """The shapes ``graph`` declares for its tensors (value_info and outputs), by name."""
    return {v.name: v for v in (*graph.value_info, *graph.output)}


def _pooling_declaration_defects(nodes: list[onnx.NodeProto], declared: Mapping[str, onnx.ValueInfoProto]) -> list[str]:
    """Pooling gradients whose output declaration their kernel cannot size dX from: none
    (the session is never made), or a symbolic dimension it reads (as 0): AveragePoolGrad's
    every dimension, MaxPoolGrad's past the first (that one it takes from dY)."""
    missing, symbolic = [], []
    for n in nodes:
        if n.op_type not in SHAPE_FROM_DECLARATION_OPS or not n.output or not n.output[0]:
            continue
        v = declared.get(n.output[0])
        t = v.type.tensor_type if v is not None and v.type.HasField("tensor_type") else None
        if t is None or not t.HasField("shape"):
            missing.append(n.name or n.output[0])
        elif any(not d.HasField("dim_value") for d in t.shape.dim[(n.op_type == "MaxPoolGrad"):]):
            symbolic.append(n.name or n.output[0])
    out = []
    if missing:
        out.append(f"{len(missing)} pooling gradient node(s) with no shape declared for their output "
                   f"({', '.join(missing[:3])}): ONNX Runtime training 1.19.2's CPU kernel reads that declaration "
                   "when the session is made, and the process dies (SIGSEGV) without it")
    if symbolic:
        out.append(f"{len(symbolic)} pooling gradient node(s) whose output declares a symbolic dimension "
                   f"({', '.join(symbolic[:3])}): ONNX Runtime training 1.19.2's CPU kernel sizes the gradient "
                   "from the declaration and reads the symbol as 0 (an AveragePool's training graph with a "
                   "symbolic batch dies with SIGFPE); declare those dimensions as numbers")
    return out


def grouped_1d_conv_grad(node: onnx.NodeProto) -> bool:
    """A ConvGrad over one spatial axis with ``group`` above 1 (see ``ort_kernel_defects``)."""
    return (node.op_type == "ConvGrad" and node.domain == "com.microsoft"
            and len(_attribute_ints(node, "kernel_shape") or ()) == 1
            and any(a.name == "group" and a.i > 1 for a in node.attribute))


def _attribute_ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == name), None)


def racing_scatter(node: onnx.NodeProto) -> bool:
    """A ScatterND that reduces (``reduction`` add, mul, min or max). ONNX Runtime's CPU kernel
    splits its updates over the intra-op threads with no ordering, each a read-modify-write:
    where indices repeat (an embedding's gradient), updates race, and the same session on the
    same inputs gives different results from run to run (measured on the gpt12 sample at two
    threads: 2 distinct embedding gradients in 6 runs; at one thread, 1)."""
    return (node.op_type == "ScatterND" and node.domain in ("", "ai.onnx")
            and any(a.name == "reduction" and a.s not in (b"", b"none") for a in node.attribute))


def thread_racing_outputs(nodes: Iterable[onnx.NodeProto], outputs: Iterable[str]) -> list[str]:
    """The graph ``outputs`` that depend on a ``racing_scatter`` (in file order), so vary
    from run to run in any session with more than one intra-op thread."""
    tainted: set[str] = set()
    for node in nodes:  # topological in a valid file, so one pass carries the taint forward
        if racing_scatter(node) or tainted.intersection(node.input):
            tainted.update(o for o in node.output if o)
    return [o for o in outputs if o in tainted]
