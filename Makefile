# ckpt — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
OUT    := out

.PHONY: demo test test-fast identity samples bench bench-quick bench-models gpu-check test-ort-training clean fuzz

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m compileall -q ckpt_cli > /dev/null  # as a pip install does: every command starts 0.2 s sooner
	# numba compiles the kernels of ckpt_cli/native*.py into its cache once here (15-20 s), not in each test worker
	$(BIN)/python -c 'from ckpt_cli import fast; fast.NATIVE_MIN_STEPS = 0; from ckpt_cli.analysis import analyse; \
	  from ckpt_cli.io.load import load_graph; from ckpt_cli.analysis.memory import buffer_roots; \
	  from ckpt_cli.rewrite.order import buffer_reads, memory_aware; g = analyse(load_graph("sample_models/gpt.onnx")).graph; \
	  memory_aware(g, buffer_reads(g, {}, buffer_roots(g)), [True] * len(g.nodes)); \
	  from ckpt_cli.analysis.schedules import ort_default; ort_default(g)'
	touch $@

## demo: install ckpt and rewrite the GPT sample, checked on ONNX Runtime
demo: $(STAMP)
	mkdir -p $(OUT)
	$(BIN)/ckpt inspect sample_models/gpt.onnx
	$(BIN)/ckpt rewrite sample_models/gpt.onnx -o $(OUT)/gpt.ckpt.onnx --force --check

## test: the suite (CPU; CUDA tests skip without a GPU), one worker per core (JOBS=1: in this process);
## an idle worker takes tests queued for the other (worksteal): the slow ones come in a row.
## The tests that run onnxruntime-training (marked ort_training) run in test-ort-training.
JOBS ?= auto
XDIST = $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist worksteal)
test: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -m "not ort_training"

## lint: ruff's pyflakes and syntax rules over the package, tests, bench and examples; mypy over the package
.PHONY: lint
lint: $(STAMP)
	$(BIN)/ruff check ckpt_cli tests bench examples sample_models
	$(BIN)/mypy ckpt_cli

## mutate: break each rule of tests/mutants.toml alone (a copy of the tree); the tests it names must fail.
## Exit 1 on a survivor. ONLY=NAME: the mutants whose name contains NAME.
.PHONY: mutate
mutate: $(STAMP)
	$(BIN)/python -m tests.mutate $(if $(ONLY),--only $(ONLY))

## test-fast: the suite without the tests marked slow (those run ONNX Runtime in child processes)
test-fast: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -m "not slow"

## compat-check: the wheel at every dependency's lower bound (samples rewritten, bit-identical in a
## plain session), and the rewrites loading on onnxruntime 1.28 (a release with a Reshape-fusion defect)
.PHONY: compat-check
compat-check:
	PY=$(PYTHON) bash bench/compat_check.sh

## wheel-check: build the wheel, install it into a fresh venv (out/wheel), then from a temporary folder run
## `ckpt --version`, the demo and `pip check`: what `pip install` gives a user, not the checkout
.PHONY: wheel-check
wheel-check:
	PY=$(PYTHON) bash bench/wheel_check.sh

## fuzz: 10,000 mutated models through inspect/plan/rewrite; any crash or invalid output is a defect
fuzz: $(STAMP)
	mkdir -p $(OUT)
	$(BIN)/python -m tests.fuzz --cases $(or $(CASES),10000) --seed $(or $(SEED),1) --json $(OUT)/fuzz.json

## docs-figures: README.md's figures as `ckpt rewrite sample_models/gpt.onnx --check` prints them today
## (tests/test_bench_readme_figures.py fails when they are stale)
.PHONY: docs-figures
docs-figures: $(STAMP)
	$(BIN)/python -m bench.readme_figures --write

## samples: regenerate sample_models/ from PyTorch (needs torch 2.13 CPU from local disk)
samples:
	bash sample_models/make_samples.sh

## bench: speed and memory benchmarks, written to bench/RESULTS.md
bench: $(STAMP)
	$(BIN)/python -m bench.run

bench-quick: $(STAMP)
	$(BIN)/python -m bench.run --quick

## bench-models: full-size GPT-2 small, ResNet-18 (224x224) and BERT-base training graphs from PyTorch
## (bench/models.py, torch 2.13 CPU in .venv-gen), written to out/bench_models/; not part of `make test`
GEN := .venv-gen
bench-models:
	$(GEN)/bin/python -c "import torch, onnx, onnxscript, onnxruntime, numpy" 2>/dev/null || ( \
	  rm -rf $(GEN) && $(PYTHON) -m venv $(GEN) && $(GEN)/bin/pip install --quiet \
	  "torch==2.13.0" "onnx==1.23.2" "onnxscript==0.7.2" "onnxruntime==1.31.1" numpy)
	$(GEN)/bin/python -W ignore -m bench.models --out-dir $(OUT)/bench_models

## test-ort-training: the tests marked ort_training (they build .venv-ort-training: onnxruntime-training
## 1.19.2), then the ORT training artifact zoo end to end: generated with onnxruntime-training 1.19.2
## and torch CPU in their own venv, then inspect, rewrite, check --python and 10 Module steps per model
ORT_TRAINING := .venv-ort-training-full
test-ort-training: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -m ort_training
	test -x $(ORT_TRAINING)/bin/python || ($(PYTHON) -m venv $(ORT_TRAINING) && \
	  $(ORT_TRAINING)/bin/pip install -q "onnxruntime-training-cpu==1.19.2" "numpy<2" "onnx==1.16.2" "torch==2.13.0")
	mkdir -p $(OUT)
	$(BIN)/python -m bench.artifacts --python $(ORT_TRAINING)/bin/python --assert --known bench/artifacts_known.json \
	  --write $(OUT)/ARTIFACTS.md --json $(OUT)/artifacts.json

## gpu-check: rewrite every sample and check it on the CUDA provider (needs a GPU)
gpu-check: $(STAMP)
	bash bench/gpu_check.sh

clean:
	rm -rf $(OUT) .pytest_cache

.PHONY: recipe-torch recipe-ort-training
## recipe-torch: export a small GPT from PyTorch (if torch is installed), ckpt rewrite, train 50 steps on ORT
recipe-torch: $(STAMP)
	PY=$(BIN)/python bash examples/torch_to_onnx_training/run.sh
## recipe-ort-training: ORT training artifacts, ckpt rewrite, 20 steps with onnxruntime.training.api.Module
recipe-ort-training: $(STAMP)
	test -x .venv-ort-training/bin/python || ($(PYTHON) -m venv .venv-ort-training && \
	  .venv-ort-training/bin/pip install -q "onnxruntime-training-cpu==1.19.2" "numpy<2")
	$(BIN)/python examples/ort_training_artifacts/run.py --python .venv-ort-training/bin/python

## identity: the same 69 ckpt command lines here and at REF (default HEAD); exit 1 on any difference
identity: $(STAMP)
	$(BIN)/python -m bench.identity --ref $(or $(REF),HEAD)
