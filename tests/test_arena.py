"""Tests of ckpt_cli.analysis.arena, the model of ORT's CPU BFC arena.

Unit tests replay hand-made request sequences and check the rules of
onnxruntime/core/framework/bfc_arena.cc (rounding, best fit, split rule,
coalescing, power-of-two growth).  The ORT tests measure real sessions with ckpt's
worker (ORT 1.31 CPU, profiler ``mem_bytes_in_use``): a hand-made graph whose request
sequence is known exactly must match at every node; the sample models must match
within 5% at the peak (their request sequence comes from ``memory.simulate``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ckpt_cli.analysis import arena as A  # noqa: E402
from ckpt_cli.analysis.arena import BFCArena, arena_peak, kernel_plans, replay  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20
SAMPLES = ROOT / "sample_models"
NUM_BINS = 21  # kNumBins


def bin_num_for_size(n: int) -> int:
    """ORT's ``BFCArena::BinNumForSize``, which the model replaces by one sorted list."""
    v = max(n, 256) >> 8
    return min(NUM_BINS - 1, v.bit_length() - 1)


def requests_replay(requests: list[tuple[str, int]], arena: BFCArena | None = None) -> BFCArena:
    """("a", n) allocates (named by position), ("f", i) frees request i."""
    arena = arena if arena is not None else BFCArena()
    ptrs: list[int | None] = []
    for op, v in requests:
        if op == "a":
            ptrs.append(arena.alloc(v))
        else:
            arena.free(ptrs[v])
    return arena


def chunks(arena: BFCArena) -> list[tuple[int, int, bool]]:
    """(address, size, in use) of every chunk, region by region in creation order."""
    out = []
    for base, _ in arena.regions:
        p: int | None = base
        while p is not None:
            out.append((p, arena.size[p], p in arena.requested))
            p = arena.next[p]
    return out


# --------------------------------------------------------------------------- rules


def test_rounding_and_bins():
    assert A.rounded_bytes(1) == 256
    assert A.rounded_bytes(256) == 256
    assert A.rounded_bytes(257) == 512
    assert bin_num_for_size(256) == 0
    assert bin_num_for_size(511) == 0
    assert bin_num_for_size(512) == 1
    assert bin_num_for_size(1 << 40) == NUM_BINS - 1
    # the bins partition the sizes in increasing order, so ORT's scan from the request's
    # bin upwards finds the smallest fitting chunk, as the model's one sorted list does
    sizes = [A.rounded_bytes(n) for n in range(1, 1 << 22, 4093)] + [1 << k for k in range(8, 41)]
    bins = [bin_num_for_size(n) for n in sorted(sizes)]
    assert bins == sorted(bins) and set(bins) == set(range(NUM_BINS))


def test_zero_bytes_allocate_nothing():
    a = BFCArena()
    assert a.alloc(0) is None
    assert a.in_use == 0 and a.held == 0 and a.regions == []


def test_first_request_creates_initial_region_and_splits():
    a = requests_replay([("a", 1000)])
    assert a.regions and a.held == 1 * MiB
    assert a.in_use == 1024 and a.requested_in_use == 1000
    assert [(s, used) for _, s, used in chunks(a)] == [(1024, True), (MiB - 1024, False)]


def test_chunk_too_small_to_split_is_in_use_whole():
    # [x 3 KiB][hole 3 KiB][y 1 KiB][rest]: a 2 KiB request gets the whole 3 KiB hole
    # (3072 < 2 * 2048); a 1.5 KiB request splits it (3072 >= 2 * 1536).
    a = requests_replay([("a", 3 * KiB), ("a", 3 * KiB), ("a", KiB), ("f", 1), ("a", 2 * KiB)])
    assert a.in_use == 3 * KiB + 3 * KiB + KiB
    assert a.requested_in_use == 3 * KiB + KiB + 2 * KiB
    b = requests_replay([("a", 3 * KiB), ("a", 3 * KiB), ("a", KiB), ("f", 1), ("a", 1536)])
    assert b.in_use == 3 * KiB + 1536 + KiB


def test_max_dead_bytes_forces_split():
    # 16 KiB hole, 10 KiB request: 16384 < 2 * 10240, but the 6 KiB waste >= max_dead.
    seq = [("a", 16 * KiB), ("a", KiB), ("f", 0), ("a", 10 * KiB)]
    assert requests_replay(seq).in_use == 16 * KiB + KiB
    assert requests_replay(seq, BFCArena(max_dead_bytes_per_chunk=4 * KiB)).in_use == 10 * KiB + KiB


def test_best_fit_smallest_chunk_then_lowest_address():
    # holes of 8 KiB (first) and 4 KiB (later): a 3 KiB request takes the 4 KiB hole
    a = requests_replay([("a", 8 * KiB), ("a", KiB), ("a", 4 * KiB), ("a", KiB), ("f", 0), ("f", 2),
                         ("a", 3 * KiB)])
    p = chunks(a)
    assert [s for _, s, used in p if used] == [KiB, 4 * KiB, KiB]  # whole 4 KiB hole (4096 < 6144)
    # two equal holes: the lower address wins
    b = requests_replay([("a", 4 * KiB), ("a", KiB), ("a", 4 * KiB), ("a", KiB), ("f", 0), ("f", 2), ("a", 4 * KiB)])
    used = [(addr, s) for addr, s, u in chunks(b) if u and s == 4 * KiB]
    assert used == [(min(addr for addr, s, u in chunks(b) if s == 4 * KiB), 4 * KiB)]


def test_coalescing_restores_whole_region_in_any_order():
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0], [0, 2, 1]):
        a = requests_replay([("a", 100 * KiB), ("a", 200 * KiB), ("a", 300 * KiB)] + [("f", i) for i in order])
        assert a.in_use == 0
        assert chunks(a) == [(a.regions[0][0], MiB, False)]
        assert a.free_chunks == [(MiB, a.regions[0][0])]
        a.alloc(MiB)  # fits without growing
        assert a.held == MiB


def test_coalescing_merges_next_and_previous_neighbours():
    a = requests_replay([("a", KiB), ("a", KiB), ("a", KiB), ("a", KiB), ("f", 0), ("f", 2), ("f", 1)])
    sizes = [(s, u) for _, s, u in chunks(a)]
    assert sizes == [(3 * KiB, False), (KiB, True), (MiB - 4 * KiB, False)]


def test_regions_never_merge():
    a = BFCArena()
    x = a.alloc(MiB)  # region 1 (1 MiB), exactly full
    y = a.alloc(MiB)  # region 2 (2 MiB)
    a.free(x)
    a.free(y)
    assert sorted(s for s, _ in a.free_chunks) == [MiB, 2 * MiB]
    a.alloc(2 * MiB + 256)  # fits in neither: a third region
    assert len(a.regions) == 3


def test_extension_growth_next_power_of_two():
    a = BFCArena()
    a.alloc(MiB)          # curr 1 MiB fits: region 1 MiB, then curr doubles to 2 MiB
    a.alloc(256)          # region 2 MiB, curr -> 4 MiB
    a.alloc(5 * MiB)      # 5 MiB > 4 MiB: curr -> 8 MiB (grown, so no doubling after)
    assert [s for _, s in a.regions] == [MiB, 2 * MiB, 8 * MiB]
    # the 8 MiB chunk is not split for 5 MiB (8 < 2 * 5, waste 3 MiB < 128 MiB): all in use
    assert a.in_use == MiB + 256 + 8 * MiB
    a.alloc(2 * MiB)      # no fit: region of curr = 8 MiB, then curr -> 16 MiB
    assert [s for _, s in a.regions] == [MiB, 2 * MiB, 8 * MiB, 8 * MiB]
    assert a.curr_region_allocation_bytes == 16 * MiB
    assert a.held == 19 * MiB


def test_extension_doubling_is_capped():
    a = BFCArena(max_power_of_two_extend_bytes=2 * MiB)
    for _ in range(4):
        a.alloc(MiB)
    assert [s for _, s in a.regions] == [MiB, 2 * MiB, 2 * MiB]
    a.alloc(5 * MiB)  # a bigger request still doubles past the cap
    assert a.regions[-1][1] == 8 * MiB


def test_new_regions_go_below_old_ones():
    a = BFCArena()
    a.alloc(MiB)
    a.alloc(MiB)
    assert a.regions[1][0] < a.regions[0][0]


# --------------------------------------------------------------------------- replay


def test_replay_timeline_and_second_run_reuses_regions():
    # buffers: (size, first step, last step); step 3 == len(order): graph output
    bufs = [(1000, 0, 1), (3 * KiB, 1, 2), (600 * KiB, 2, 3)]
    traces, a = replay(bufs, 3, runs=2, small_initializer_bytes=68)
    first, second = traces
    # step 2: the 600 KiB request takes the 1020 KiB tail whole (1020 < 2 * 600)
    assert first.in_use == [68 + 1024, 68 + 1024 + 3 * KiB, 68 + 3 * KiB + (MiB - 4 * KiB)]
    assert first.requested == [68 + 1000, 68 + 1000 + 3 * KiB, 68 + 3 * KiB + 600 * KiB]
    assert second.in_use == first.in_use
    assert a.in_use == 0  # graph outputs dropped after each run
    assert a.held == MiB  # the second run needed no new region


def test_kernel_plan_temporaries_before_outputs_move_the_output():
    # Step 1 allocates a 3 KiB output. With a 3 KiB temporary taken first (Where-style),
    # the temporary takes the 3 KiB hole and the output goes to the tail; once the
    # temporary is released, step 2's 2 KiB request gets the hole whole.
    bufs = [(3 * KiB, 0, 0), (KiB, 0, 3), (3 * KiB, 1, 3), (2 * KiB, 2, 3)]
    plain, _ = replay(bufs, 3, runs=1)
    planned, _ = replay(bufs, 3, runs=1, plans={1: (("tmp", 3 * KiB), ("out",), ("free_tmp",))})
    assert plain[0].in_use[2] == KiB + 3 * KiB + 2 * KiB
    assert planned[0].in_use[2] == KiB + 3 * KiB + 3 * KiB
    assert planned[0].kernel_peak[1] == KiB + 6 * KiB
    # a temporary taken after the outputs changes nothing but the kernel peak
    after, _ = replay(bufs, 3, runs=1, plans={1: (("out",), ("tmp", 3 * KiB))})
    assert after[0].in_use == plain[0].in_use


def test_variadic_plan_releases_each_temporary_once_the_next_is_made():
    # A Sum of four inputs at step 1: temporaries of 2 and 6 KiB, then a 6 KiB output. The
    # first is released once the second is made, so the kernel holds 8 KiB before its output
    # and 12 KiB with it, never all three.
    bufs = [(KiB, 0, 3), (6 * KiB, 1, 3)]
    traces, arena = replay(bufs, 3, runs=1, plans={1: A.variadic_plan([2 * KiB, 6 * KiB])})
    assert traces[0].kernel_peak[1] == KiB + 12 * KiB
    assert traces[0].in_use[1] == KiB + 6 * KiB
    assert A.variadic_plan([4 * KiB]) == (("tmp", 4 * KiB), ("out",), ("free_tmp",))


def test_kernel_plans_replay_the_temporaries_of_a_sum_of_three():
    from ckpt_cli.analysis.shapes import infer_tensors
    from ckpt_cli.graph import Graph

    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [64, 256])  # noqa: E731
    g = helper.make_graph([helper.make_node("Sum", ["x", "y", "z"], ["s"]), helper.make_node("Sum", ["x", "s"], ["t"])],
                          "g", [vi("x"), vi("y"), vi("z")], [vi("t")])
    graph = Graph.from_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    plans = kernel_plans(graph, [0, 1], infer_tensors(graph))
    assert plans == {0: A.variadic_plan([64 * KiB])}  # two inputs take no temporary


def test_arena_peak_on_a_profile():
    from ckpt_cli.analysis.memory import MemoryProfile

    prof = MemoryProfile(order=(0, 1, 2), peak_bytes=0, peak_step=0, resident_bytes=0, timeline=(0, 0, 0),
                         live_at_peak=(), unsized=(),
                         buffers=((3 * KiB, 0, 3), (3 * KiB, 1, 1), (KiB, 1, 3), (2 * KiB, 2, 3)))
    res = arena_peak(prof, 100)
    assert res.timeline_requested == (100 + 3 * KiB, 100 + 7 * KiB, 100 + 6 * KiB)
    assert res.timeline_in_use == (100 + 3 * KiB, 100 + 7 * KiB, 100 + 7 * KiB)  # 2 KiB took the 3 KiB hole
    assert (res.peak_in_use_bytes, res.peak_step) == (100 + 7 * KiB, 1)
    assert res.held_bytes == MiB + 100 and res.regions == (MiB,)


def test_a_replay_gives_up_at_the_first_step_over_its_bound_in_the_measured_run():
    bufs = [(1000, 0, 1), (3 * KiB, 1, 2), (600 * KiB, 2, 3)]
    full, _ = replay(bufs, 3, runs=2, small_initializer_bytes=68, last_only=True)
    # a bound the peak does not pass changes nothing
    same, _ = replay(bufs, 3, runs=2, small_initializer_bytes=68, last_only=True,
                     give_up_above=max(full[0].in_use))
    assert same[0].in_use == full[0].in_use
    # a bound step 1 passes: the measured run stops there (the warm-up run ran whole)
    cut, a = replay(bufs, 3, runs=2, small_initializer_bytes=68, last_only=True,
                    give_up_above=full[0].in_use[0])
    assert cut[0].in_use == full[0].in_use[:2] and cut[0].in_use[-1] > full[0].in_use[0]
    assert a.held == MiB


def test_conv_working_buffer():
    class N:
        def __init__(self, **attrs):
            self.attrs = attrs

        def attr(self, name, default=None):
            return self.attrs.get(name, default)

    # 3x3 pad 1: one MLAS working block of 16384 floats (measured on ORT 1.31.1, batch 8)
    assert A.conv_working_bytes(N(pads=[1, 1, 1, 1]), (8, 3, 32, 32), (16, 3, 3, 3), (8, 16, 32, 32)) == 65536
    # pointwise, stride 1, no padding: none
    assert A.conv_working_bytes(N(), (8, 16, 8, 8), (32, 16, 1, 1), (8, 32, 8, 8)) == 0
    # more filters than output pixels: full im2col, OutputSize * K floats
    assert A.conv_working_bytes(N(pads=[1, 1, 1, 1]), (8, 64, 2, 2), (128, 64, 3, 3), (8, 128, 2, 2)) == 4 * 4 * 576


# --------------------------------------------------------------------------- ORT


def _measure(path, settings, tmp_path, feeds=None):
    from ckpt_cli import verify as rt
    from ckpt_cli.verify.feeds import make_feeds, save_feeds

    fp = tmp_path / "feeds.npz"
    if feeds is None:
        save_feeds(str(fp), make_feeds(onnx.load(str(path))))
    else:
        np.savez(fp, **feeds)
    return rt.run_model(str(path), str(fp), provider="cpu", settings=settings, runs=1,
                        worker=rt.WorkerOptions(extra_outputs=("timeline",)))


def test_matches_ort_at_every_node_on_a_known_request_sequence(tmp_path):
    """a = Neg(x) 48 KiB; b = Neg(a) 48 KiB; c = Slice(b) 32 KiB lands in a's 48 KiB hole,
    which is too small to split (48 < 64): ORT reports the whole chunk; out = Concat(b, c)."""
    n = 12288
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="n0"),
        helper.make_node("Neg", ["a"], ["b"], name="n1"),
        helper.make_node("Slice", ["b", "st", "en"], ["c"], name="n2"),
        helper.make_node("Concat", ["b", "c"], ["out"], axis=0, name="n3"),
    ]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "st"),
             numpy_helper.from_array(np.array([8192], np.int64), "en")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [n + 8192])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    r = _measure(path, "ckpt", tmp_path, {"x": np.ones(n, np.float32)})
    buffers = [(4 * n, 0, 1), (4 * n, 1, 3), (4 * 8192, 2, 3), (4 * (n + 8192), 3, 4)]
    traces, arena = replay(buffers, 4, runs=2, small_initializer_bytes=r["baseline_bytes"])
    assert [t[0] for t in r["timeline"]] == ["n0", "n1", "n2", "n3"]
    assert [t[3] for t in r["timeline"]] == traces[-1].in_use
    assert [t[4] for t in r["timeline"]] == traces[-1].requested
    assert traces[-1].in_use[2] - traces[-1].requested[2] == 16 * KiB  # the unsplit chunk


@pytest.mark.parametrize("sample", ["mlp", "gpt", "cnn"])
def test_sample_peak_within_5_percent_of_ort(sample, tmp_path):
    from ckpt_cli.analysis import analyse, default_order
    from ckpt_cli.io.load import load_graph

    path = SAMPLES / f"{sample}.onnx"
    g = load_graph(str(path))
    an = analyse(g)
    for settings, prof in (("ckpt", an.priority), ("ckpt_default_order", default_order(an))):
        r = _measure(path, settings, tmp_path)
        assert [t[0] for t in r["timeline"]] == [g.nodes[i].name for i in prof.order]
        res = arena_peak(prof, r["baseline_bytes"], plans=kernel_plans(g, prof.order, an.tensors))
        measured = r["peak_bytes"]
        assert abs(res.peak_in_use_bytes - measured) <= 0.05 * measured, (settings, res.peak_in_use_bytes, measured)
        # the arena's overhead over the exact requests is real and the model sees it
        assert r["peak_bytes"] > r["peak_requested_bytes"]
        assert res.peak_in_use_bytes > res.peak_requested_bytes
        assert res.held_bytes >= res.peak_in_use_bytes


def test_an_arena_state_tells_which_chunks_are_in_use():
    # two arenas with the same chunks, the first or the second of two equal ones free: a
    # later request lands in different places, so their states differ; equal histories
    # give equal states
    def arena(free_first: bool) -> BFCArena:
        a = BFCArena()
        first, second, _third = a.alloc(256 * 1024), a.alloc(256 * 1024), a.alloc(256 * 1024)
        a.free(first if free_first else second)
        return a

    assert arena(True).state() != arena(False).state()
    assert arena(True).state() == arena(True).state()
    grown = arena(True)
    grown.alloc(4 << 20)  # a new region
    assert grown.state() != arena(True).state()
