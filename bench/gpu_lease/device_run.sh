#!/usr/bin/env bash
# Device call 2 of a GPU lease (README.md): install onnxruntime-gpu from the carried parts, probe, run make gpu-check.
set -u
T0=$(date +%s)
S=/tmp/site; mkdir -p $S /tmp/bin
[[ -f /tmp/gpu/libonnxruntime_providers_cuda.so ]] || { echo "part 1 missing on this machine"; exit 9; }
tar xJf .gpu/p2/rest.tar.xz -C $S && cp /tmp/gpu/libonnxruntime_providers_cuda.so $S/onnxruntime/capi/ || exit 9
# ckpt's own dependencies the image lacks (google-re2, highspy), carried as wheels
if ls .gpu/p2/whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $S .gpu/p2/whl/*.whl || exit 9
fi
export PYTHONPATH=$S:$PWD PYTHONUNBUFFERED=1
NV=$(python3 -c "import nvidia,os;print(os.path.dirname(nvidia.__file__) if nvidia.__file__ else list(nvidia.__path__)[0])" 2>/dev/null)
export LD_LIBRARY_PATH=$(find "$NV" -maxdepth 3 -type d -name lib | tr '\n' ':')${LD_LIBRARY_PATH:-}
printf '#!/bin/sh\nexec python3 -c "import sys; from ckpt_cli.cli import main; sys.argv[0] = \\"ckpt\\"; sys.exit(main())" "$@"\n' > /tmp/bin/ckpt
chmod +x /tmp/bin/ckpt; export PATH=/tmp/bin:$PATH
echo "install $(( $(date +%s) - T0 )) s; nvidia libs: $NV"
python3 -c "import onnxruntime as o; print(o.__version__, o.__file__, o.get_available_providers())"
ckpt --version
timeout 90 python3 .gpu/p2/probe.py .gpu/p2/prebuilt/gpt.default.onnx > $OUT/probe.txt 2>&1; echo "probe rc $?"; head -c 700 $OUT/probe.txt
grep -q "session \['CUDAExecutionProvider'" $OUT/probe.txt || { echo "CUDA provider did not load; stopping"; exit 8; }
BIN=/none GPU_CHECK_PREBUILT=.gpu/p2/prebuilt GPU_CHECK_SAMPLES="${SAMPLES:-gpt gpt12 cnn synthetic resnet18 mlp}" \
    timeout ${BUDGET:-300} bash bench/gpu_check.sh > $OUT/gpu_check.log 2>&1; echo "gpu_check rc $?"
cp bench/GPU_RESULTS.md $OUT/ 2>/dev/null
tar czf $OUT/gpu_out.tgz out/gpu/*.json out/gpu/*.err out/gpu/*.rc out/gpu/*.seconds 2>/dev/null
tail -c 6000 $OUT/gpu_check.log
echo "total $(( $(date +%s) - T0 )) s"
