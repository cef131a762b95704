#!/usr/bin/env bash
# Prepare the two device calls of a GPU lease (README.md beside this file):
#   .gpu/p1/cuda90.xz      onnxruntime-gpu's CUDA provider, sm_90 cubins only (about 52 MB)
#   .gpu/p2/rest.tar.xz    the rest of the onnxruntime-gpu package (about 13 MB)
#   .gpu/p2/whl/           ckpt's dependencies the image lacks (google-re2, highspy)
#   .gpu/p2/prebuilt/      the rewrites make gpu-check checks (CPU work, done here)
#   .gpu/p2/device_run.sh, probe.py
# Run from the repository root, with .venv made (make demo). Needs xz, readelf, pip.
set -euo pipefail
ORT=${ORT_GPU_VERSION:-1.31.1}
SM=${GPU_SM:-90}
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/p1 .gpu/p2/prebuilt .gpu/wheel
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d .gpu/wheel "onnxruntime-gpu==$ORT"
(cd .gpu/wheel && unzip -q ./*.whl && rm -f onnxruntime/capi/libonnxruntime_providers_tensorrt.so)
lib=.gpu/wheel/onnxruntime/capi/libonnxruntime_providers_cuda.so
.venv/bin/python bench/gpu_lease/prune_fatbin.py "$lib" "$SM" .gpu/cuda.so
xz -9 -T2 -c .gpu/cuda.so > .gpu/p1/cuda90.xz && rm "$lib" .gpu/cuda.so
(cd .gpu/wheel && tar cf - onnxruntime onnxruntime_gpu-*.dist-info | xz -9 -T2 > ../p2/rest.tar.xz)
rm -rf .gpu/wheel
# ckpt's dependencies the device image lacks; pinned to this venv's versions
mkdir -p .gpu/p2/whl
for pkg in google-re2 highspy; do  # the image has onnx, numpy, click and rich
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .gpu/p2/whl "$pkg==$(.venv/bin/python -m pip show "$pkg" | awk '/^Version/{print $2}')"
done
cp bench/gpu_lease/device_run.sh bench/gpu_lease/probe.py .gpu/p2/
.venv/bin/python -m bench.synthetic --layers 35 -o .gpu/p2/prebuilt/synthetic.onnx
for name in gpt cnn gpt12 resnet18 mlp synthetic; do
    model=sample_models/$name.onnx; [[ $name == synthetic ]] && model=.gpu/p2/prebuilt/synthetic.onnx
    .venv/bin/ckpt rewrite "$model" -o ".gpu/p2/prebuilt/$name.default.onnx" --force -q
    .venv/bin/ckpt rewrite "$model" -o ".gpu/p2/prebuilt/$name.budget50.onnx" --force -q --budget 50% || true
done
du -sh .gpu/p1 .gpu/p2
