# hf_attn_variants — make install | test | demo | bench | lint | lock | compat | gpu-wheels
# Creates .venv from nothing with exactly the packages of the committed lock (locks/requirements.txt), so a
# fresh clone on any later day gets the set that was tested. On a machine without CUDA the CPU build of torch
# is installed first (it is not in the lock: PyPI's default wheel pulls several GB of CUDA packages).
# `make lock` re-resolves the newest releases and rewrites the lock only when the suite passes with them;
# `make compat` is the canary for the newest Transformers on the index (not part of `make test`).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# Extra pip arguments for the torch install, e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP_ARGS ?=
PYTEST_WORKERS ?= 2
LOCK ?= locks/requirements.txt
# MKL_VENDOR=intel|other: run under oneMKL's code path for that CPU vendor (tests/mkl_dispatch.py), e.g.
# `make test MKL_VENDOR=intel` on an AMD CPU runs the suite with an Intel Xeon's float32 products.
MKL_VENDOR ?=
ifneq ($(filter-out intel other,$(MKL_VENDOR)),)
$(error MKL_VENDOR: expected intel or other, got '$(MKL_VENDOR)')
endif
MKL_PRELOAD = $(if $(MKL_VENDOR),MKL_VENDOR=$(MKL_VENDOR) LD_PRELOAD="$$($(BIN)/python -m tests.mkl_dispatch $(MKL_VENDOR))")
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1 && echo yes)

.PHONY: install test demo bench lint lock compat clean gpu-wheels

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip -c $(LOCK)
ifeq ($(HAS_CUDA),yes)
	$(BIN)/python -m pip install --quiet "torch>=2.7" -c $(LOCK) $(TORCH_PIP_ARGS)
else
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)" -c $(LOCK) $(TORCH_PIP_ARGS)
endif

# --no-deps: exactly the lock's set (the optional test packages included, which pin other stacks), no resolution.
$(VENV)/.installed: $(BIN)/python pyproject.toml $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps -r $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

install: $(VENV)/.installed

LINT_PATHS := src tests scripts $(wildcard tools)

test: install lint
	$(if $(MKL_VENDOR),$(BIN)/python -m tests.mkl_dispatch $(MKL_VENDOR))
	$(MKL_PRELOAD) $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --durations=15 tests

demo: install
	$(BIN)/python -m hf_attn_variants demo

# The package's bench writes the committed results file and plots; the repository's renderer shows them in docs/.
bench: install
	$(BIN)/python -m hf_attn_variants bench --publish
	$(BIN)/python tools/render_docs.py

lock:
	$(PYTHON) scripts/lock.py --torch $(TORCH_VERSION) --workers $(PYTEST_WORKERS)
	rm -f $(VENV)/.installed

compat: install
	$(BIN)/python scripts/compat.py

# Wheels for scripts/gpu_check.sh on a lent GPU machine, which has no network: its image holds torch, triton,
# accelerate, peft, pytest, pytest-xdist and every other package the check imports, but its own transformers; these
# bring the lock's, so the GPU numbers come from the version the suite runs on (without .whl/ the check uses the
# machine's), and the peer the peers stage times (FLASH-pytorch, with rotary-embedding-torch and einops, all pure
# Python). Downloaded for that machine: CPython 3.12, manylinux x86-64, no dependencies (the rest is there); the
# check installs them with pip --no-index --no-deps. The package's own wheel is built beside them: the check's
# wheel stage installs it on the machine's torch.
locked = $(1)==$(shell sed -n 's/^$(1)==//p' $(LOCK))
GPU_WHEELS ?= $(call locked,transformers) $(call locked,FLASH-pytorch) $(call locked,rotary-embedding-torch) \
	$(call locked,einops)
GPU_WHEEL_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
	manylinux1_x86_64

gpu-wheels: install
	rm -rf .whl && mkdir -p .whl
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(addprefix --platform ,$(GPU_WHEEL_PLATFORMS)) -d .whl $(GPU_WHEELS)
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation -w .whl .
	@du -ch .whl/*.whl | tail -n 1 | sed 's/total$$/in .whl\/ (bring it along with the working tree)/'

# ruff (E501 at pyproject's 110 characters included) and mypy on the model code (pyproject's [tool.mypy]),
# both pinned in the lock; `make test` runs them first.
# mypy's cache outside the clone (it follows imports into torch and transformers: about 50 s cold on 2 cores, a few
# seconds warm); valid across clones, as it is keyed by module contents and mypy's version.
MYPY_CACHE_DIR ?= $(or $(HF_ATTN_VARIANTS_CACHE),$(HOME)/.cache/hf_attn_variants)/mypy

lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/python -m mypy --cache-dir "$(MYPY_CACHE_DIR)"

clean:
	rm -rf $(VENV) runs .pytest_cache
