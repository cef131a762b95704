"""What the CUDA provider runs where, and what its profiler reports (device probe of a GPU lease)."""
import collections, json, sys, time
import numpy as np
import onnxruntime as ort

path = sys.argv[1]
try:
    ort.preload_dlls()
except Exception as e:  # noqa: BLE001
    print("preload_dlls:", e)
so = ort.SessionOptions()
so.enable_profiling = True
so.profile_file_prefix = "/tmp/probe"
so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
so.enable_mem_pattern = False
t = time.time()
s = ort.InferenceSession(path, so, providers=[("CUDAExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"}), "CPUExecutionProvider"])
print("session", s.get_providers(), f"{time.time() - t:.2f}s")
feeds = {}
for i in s.get_inputs():
    shape = [d if isinstance(d, int) else 1 for d in i.shape]
    feeds[i.name] = np.zeros(shape, np.int64) if "int64" in i.type else np.asarray(np.random.rand(*shape) * 0.01, np.float32)
for _ in range(3):
    t = time.time(); s.run(None, feeds); print(f"run {time.time() - t:.4f}s")
prof = json.load(open(s.end_profiling()))
nodes = [e for e in prof if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
print("node events", len(nodes))
print("by provider", collections.Counter(e["args"].get("provider") for e in nodes))
print("arg keys", collections.Counter(k for e in nodes for k in e["args"]))
print("op types not CUDA", collections.Counter(e["args"].get("op_name") for e in nodes if e["args"].get("provider") != "CUDAExecutionProvider").most_common(30))
print("memcpy", [(e["name"], e["args"].get("op_name")) for e in nodes if "Memcpy" in e["args"].get("op_name", "")][:20])
for e in nodes[:12] + nodes[-5:]:
    print(e["name"], e["args"])
