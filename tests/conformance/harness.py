"""Run Transformers' own common model tests (``ModelTesterMixin``) against custom model classes.

Why
---
``transformers`` ships its common model test-suite (``tests/test_modeling_common.py``) only in the
source distribution, not in the wheel. This harness fetches the sdist of the *installed* version at
test time, extracts the two files it needs, caches them, imports them under a private package name
and exposes ``ModelTesterMixin`` plus a few helpers so that a family test file can run the upstream
suite against its own config/model classes. Nothing from transformers' tests is committed here.

Fetching and caching
--------------------
* Cache directory: ``$HF_ATTN_VARIANTS_CACHE/transformers-tests/<version>/`` if the environment
  variable is set, else ``~/.cache/hf_attn_variants/transformers-tests/<version>/``.
  Inside it: ``sdist/transformers-<version>.tar.gz`` (pip's download; put a tarball there by hand to
  work offline), ``upstream/`` (the extracted files, created by an atomic rename) and ``wheels/``
  (the ``parameterized`` wheel, see below).
* The download (``python -m pip download transformers==<version> --no-binary transformers
  --no-deps``) runs once, under a file lock, so concurrent pytest-xdist workers are safe.
* ``test_modeling_common.py`` imports ``parameterized`` (a test-only dependency of transformers).
  If it is not installed, its pure-Python wheel is downloaded into the cache and put on
  ``sys.path``. Better: add ``parameterized`` to the ``dev`` extra.
* If anything fails (no network, unknown version, upstream API drift), importing this module still
  works, but every test of every class built here FAILS with a message that says what went wrong
  and how to fix it -- it never skips silently.
* ``tests/conftest.py`` must register the pytest markers the upstream file uses
  (``TRANSFORMERS_COMMON_TEST_MARKERS``): the project runs with ``--strict-markers``. A newer
  transformers that adds a marker shows up as "'<name>' not found in `markers`" at collection.

Quick start (one family, one configuration)
-------------------------------------------
::

    from tests.conformance.harness import make_common_test_case

    TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, max_position_embeddings=64, pad_token_id=0)

    TestEntropyInvariantCommon = make_common_test_case(
        "TestEntropyInvariantCommon",
        config_class=EntropyInvariantConfig,
        config_kwargs=TINY,
        all_model_classes=(EntropyInvariantModel, EntropyInvariantForMaskedLM,
                           EntropyInvariantForSequenceClassification),
        skip_tests={
            "test_eager_matches_sdpa_inference": "no SDPA kernel: the log(n) scale is applied in eager only",
        },
    )

Several configurations of one family (e.g. GAU with softmax_plus / relu2 / chunked) are just several
calls with different ``config_kwargs`` and different class names. Bind each result to one module-level
name equal to its class name: pytest collects every ``TestCase`` subclass bound in the module
namespace, so a second binding (or a module-level "base" case) would run the suite again::

    for variant in ("softmax_plus", "relu2"):
        name = f"TestGAU_{variant}_Common"
        globals()[name] = make_common_test_case(name, config_class=GAUConfig,
                                                config_kwargs={**TINY, "attention_kind": variant}, ...)

The long form, equivalent to the factory, is a hand-written class::

    class TestFooCommon(CommonModelTest, unittest.TestCase):
        config_class = FooConfig
        config_kwargs = TINY
        all_model_classes = (FooModel, FooForCausalLM)
        model_tester_kwargs = {"attrs": {"num_attention_heads": 1}}   # ModelTester(**...)
        skip_tests = {"test_resize_tokens_embeddings": "reason"}

        def test_something_extra(self):
            config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
            ...

Plain upstream style (``class T(ModelTesterMixin, unittest.TestCase)`` + your own ``setUp``) also
works, but then you get none of the registration / skip handling below.

What ``CommonModelTest`` adds on top of the raw ``ModelTesterMixin``
-------------------------------------------------------------------
1. **Task registration.** Many upstream tests decide what to do from the *class name* being listed in
   transformers' auto-mapping name tables (``MODEL_MAPPING_NAMES`` = base models,
   ``MODEL_FOR_MASKED_LM_MAPPING_NAMES`` ...). E.g. ``_prepare_for_class(..., return_labels=True)``
   only builds ``labels`` for a class listed as a masked/causal LM or classifier, ``test_training``
   skips base models by that list, ``test_inputs_embeds_matches_input_ids`` and the RoPE tests only
   run for listed base models. The harness adds each class to a private copy of those tables (keyed
   by ``config_class.model_type``; transformers' own tables are not touched). The task is inferred
   from the class-name suffix (``...Model`` -> base, ``ForMaskedLM``, ``ForCausalLM``/``LMHeadModel``,
   ``ForSequenceClassification``, ``ForTokenClassification``, ``ForQuestionAnswering``,
   ``ForMultipleChoice``, ``ForPreTraining``, ``ForNextSentencePrediction``); override or declare with
   ``model_tasks={cls: "masked-lm" | ... | None}``. Unknown suffixes raise at import.
2. **Auto registration** (``register_auto_classes=True``): if the config / classes are not yet known to
   ``AutoConfig`` / ``AutoModel*``, they are registered (process-wide, ``exist_ok``), because
   ``test_load_with_mismatched_shapes`` loads through ``AutoModelForSequenceClassification`` /
   ``AutoModel`` and ``test_torch_save_load`` looks the config up in ``MODEL_MAPPING``.
   If the package registers itself on import this is a no-op.
3. **Skips with reasons.** ``skip_tests = {"test_name": "one-line reason"}``. The key is an exact test
   name, or the base name of a ``parameterized`` test, which skips all its expansions (e.g.
   ``"test_eager_matches_sdpa_inference"`` skips ``test_eager_matches_sdpa_inference_00_fp16_...``).
   Keys that match no test, and empty or multi-line reasons, raise at import. The reason is shown by
   ``pytest -rs``.
4. **Defaults for custom models**: ``test_can_init_all_missing_weights_before_2023 = True`` (upstream
   skips that init test when the config file has no ``# Copyright 20xx`` line >= 2023);
   ``test_generation_tester_mixin_inheritance`` is skipped with a reason when a class can generate
   (``GenerationTesterMixin`` is not in the sdist, see the stubs in ``_install_stub_modules``).
5. **``test_config``** runs upstream's ``ConfigTester.run_common_tests()`` with ``config_kwargs``;
   ``config_tester_kwargs`` may carry ``common_properties`` (default: hidden_size,
   num_attention_heads, num_hidden_layers + vocab_size), ``has_text_modality`` and
   ``can_init_without_params``; set it to ``None`` to skip ``test_config``.

Upstream class attributes that matter (set them via ``mixin_attrs=`` in the factory or in the class)
----------------------------------------------------------------------------------------------------
* ``all_model_classes``: tuple of model classes; ``[0]`` is used for the SDPA / attention checks.
* ``has_attentions`` (True): model returns ``attentions`` (4-D ``(batch, heads, q, k)`` per layer).
  False skips attention-output / SDPA tests.
* ``test_resize_embeddings`` (True): resize_token_embeddings tests (needs ``get/set_input_embeddings``
  and, for heads, ``get_output_embeddings``).
* ``test_resize_position_embeddings`` (False), ``test_mismatched_shapes`` (True),
  ``test_missing_keys`` (True), ``test_all_params_have_gradient`` (True: every parameter must get a
  grad in the gradient-checkpointing training tests), ``is_encoder_decoder`` (False),
  ``_is_composite`` (False), ``model_split_percents`` (only used by accelerator offload tests).
* ``additional_model_inputs``: extra input names forwarded in the SDPA-equivalence test.

Tester attributes read by the upstream tests (``ModelTester`` provides them)
-----------------------------------------------------------------------------
``prepare_config_and_inputs_for_common() -> (config, inputs_dict)``, ``get_config()``,
``batch_size``, ``seq_length``, ``is_training``, ``vocab_size``, ``hidden_size``,
``num_hidden_layers`` (must be <= 2: ``test_num_layers_is_small``), ``num_attention_heads``
(expected size of dim 1 of every attention map), ``num_choices``; optional ones given through
``model_tester_kwargs`` / ``attrs``: ``key_length``, ``encoder_seq_length``, ``chunk_length``,
``expected_num_hidden_layers`` (default ``num_hidden_layers + 1``), ``num_hidden_states_types``.
"""

from __future__ import annotations

import copy
import importlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import traceback
import types
import unittest
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import transformers
from transformers import PreTrainedConfig, PreTrainedModel

__all__ = [
    "ATTENTION_INDEPENDENT_TESTS",
    "attention_independent_skips",
    "TASKS",
    "CommonModelTest",
    "ConfigTester",
    "ModelTester",
    "ModelTesterMixin",
    "UpstreamTestsUnavailable",
    "fetch_upstream_tests",
    "floats_tensor",
    "ids_tensor",
    "infer_task",
    "load_training_mixin",
    "load_upstream",
    "make_common_test_case",
    "random_attention_mask",
    "upstream_cache_dir",
    "upstream_load_error",
]

#: Upstream tests that never depend on the attention component: embeddings, heads and losses, tied weights,
#: output containers, dtype keyword handling, torch.utils.checkpoint modes. A family's extra configurations
#: skip them (``attention_independent_skips``); they run once, for its default configuration. Every test that
#: runs a forward/backward pass through attention, saves/loads/initialises its tensors or inspects attentions
#: stays on for every configuration.
ATTENTION_INDEPENDENT_TESTS = (
    "test_bc_torch_dtype",  # torch_dtype= vs dtype= keyword handling of from_pretrained
    "test_resize_tokens_embeddings",  # embed_tokens / lm_head
    "test_resize_embeddings_untied",
    "test_resize_embeddings_untied_no_reinit_on_post_init",
    "test_model_get_set_embeddings",
    "test_inputs_embeds",
    "test_inputs_embeds_matches_input_ids",
    "test_enable_input_require_grads_with_gradient_checkpointing",  # embedding hook
    # torch.utils.checkpoint modes; test_training_gradient_checkpointing stays on
    "test_training_gradient_checkpointing_use_reentrant_true",
    "test_training_gradient_checkpointing_use_reentrant_false",
    "test_problem_types",  # classification losses
    "test_causal_lm_loss_honors_shift_labels",
    "test_feed_forward_chunking",  # FeedForward block
    "test_model_outputs_equivalence",  # tuple vs ModelOutput containers
    "test_capture_outputs_decorator",  # output recording (test_attention_outputs stays on)
    "test_can_capture_specific_layers_hidden_states",
    "test_load_save_without_tied_weights",  # tied lm_head
    "test_model_weights_reload_no_missing_tied_weights",
    "test_tied_weights_keys",
    "test_base_model_prefix_loads_base_weights",  # head ↔ base-model prefix mapping
    "test_load_with_mismatched_shapes",  # classifier shapes
    "test_can_load_ignoring_mismatched_shapes",
)


def attention_independent_skips(default_case: str) -> dict[str, str]:
    """``skip_tests`` for a family's extra configuration: ``ATTENTION_INDEPENDENT_TESTS``, each with the
    reason that names ``default_case``, the test case that runs them."""
    reason = f"independent of the attention component; runs for the default configuration ({default_case})"
    return dict.fromkeys(ATTENTION_INDEPENDENT_TESTS, reason)


#: Private package name under which the upstream test files are imported.
UPSTREAM_PACKAGE = "_transformers_upstream_tests"
#: Files extracted from the sdist's ``tests/`` directory.
UPSTREAM_FILES = ("test_modeling_common.py", "test_configuration_common.py", "test_training_mixin.py")
_COMPLETE_MARKER = ".complete"
_LOCK_TIMEOUT_S = 900.0


class UpstreamTestsUnavailable(RuntimeError):
    """The transformers common tests could not be fetched, extracted or imported."""


# --------------------------------------------------------------------------------------------------
# Fetching and caching
# --------------------------------------------------------------------------------------------------


def upstream_cache_dir(version: str | None = None) -> Path:
    """Return the per-version cache directory (it may not exist yet)."""
    version = version or transformers.__version__
    env_root = os.environ.get("HF_ATTN_VARIANTS_CACHE")
    root = Path(env_root).expanduser() if env_root else Path.home() / ".cache" / "hf_attn_variants"
    return root / "transformers-tests" / version


def _run_pip(args: Sequence[str], what: str) -> None:
    """Run ``python -m pip <args>``; raise ``UpstreamTestsUnavailable`` with pip's output on failure."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        *args,
        "--disable-pip-version-check",
        "--retries",
        "2",
        "--timeout",
        "30",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UpstreamTestsUnavailable(f"could not run pip to download {what}: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise UpstreamTestsUnavailable(
            f"`{' '.join(cmd)}` failed (exit {proc.returncode}) while downloading {what}.\n{tail}"
        )


def _find_or_download_sdist(dest: Path, version: str) -> Path:
    """Return the transformers sdist tarball in ``dest``, downloading it with pip if absent."""
    candidates = sorted(dest.glob(f"transformers-{version}.tar.gz"))
    if not candidates:
        dest.mkdir(parents=True, exist_ok=True)
        # `--no-binary transformers` (rather than `:all:`) gets the same sdist without also building
        # pip's build-isolation dependencies from source.
        _run_pip(
            [
                "download",
                f"transformers=={version}",
                "--no-binary",
                "transformers",
                "--no-deps",
                "-d",
                str(dest),
            ],
            f"the transformers {version} sdist",
        )
        candidates = sorted(dest.glob(f"transformers-{version}.tar.gz"))
    if not candidates:
        raise UpstreamTestsUnavailable(f"pip reported success but no transformers-{version}.tar.gz in {dest}")
    return candidates[0]


def _extract_upstream_files(sdist: Path, out_dir: Path, version: str) -> None:
    """Copy ``tests/<UPSTREAM_FILES>`` out of the sdist tarball (no other member is extracted)."""
    with tarfile.open(sdist, "r:gz") as tar:
        for filename in UPSTREAM_FILES:
            member_name = f"transformers-{version}/tests/{filename}"
            try:
                member = tar.getmember(member_name)
            except KeyError as exc:
                raise UpstreamTestsUnavailable(f"{sdist.name} has no {member_name}") from exc
            source = tar.extractfile(member)
            if source is None:
                raise UpstreamTestsUnavailable(f"{member_name} in {sdist.name} is not a regular file")
            (out_dir / filename).write_bytes(source.read())
    # Upstream's tests/__init__.py is empty but not in the sdist; test_configuration_common.py executes
    # it through `direct_transformers_import(Path(__file__).parent)`.
    (out_dir / "__init__.py").write_text("", encoding="utf-8")
    (out_dir / _COMPLETE_MARKER).write_text(f"extracted from {sdist.name}\n", encoding="utf-8")


def _file_lock(path: Path) -> Any:
    """An inter-process lock (``filelock`` is a hard dependency of transformers)."""
    from filelock import FileLock

    return FileLock(str(path), timeout=_LOCK_TIMEOUT_S)


def fetch_upstream_tests(version: str | None = None) -> Path:
    """Return a directory holding the upstream test files, fetching them once per version.

    Safe under concurrency: the work happens under a file lock, and the result directory appears
    through an atomic rename, so a reader never sees a half-extracted directory.
    """
    version = version or transformers.__version__
    root = upstream_cache_dir(version)
    final = root / "upstream"

    def complete() -> bool:  # a cache from before a file was added to UPSTREAM_FILES is extracted again
        return (final / _COMPLETE_MARKER).is_file() and all((final / name).is_file()
                                                            for name in UPSTREAM_FILES)

    if complete():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UpstreamTestsUnavailable(f"cannot create cache directory {root}: {exc}") from exc
    with _file_lock(root / ".lock"):
        if complete():  # another worker finished while we waited
            return final
        sdist = _find_or_download_sdist(root / "sdist", version)
        tmp = Path(tempfile.mkdtemp(prefix="upstream.tmp-", dir=root))
        try:
            _extract_upstream_files(sdist, tmp, version)
            if final.exists():  # leftover without marker (e.g. interrupted by hand): replace it
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _ensure_parameterized(version: str) -> None:
    """Make ``import parameterized`` work, downloading its pure-Python wheel into the cache if needed."""
    try:
        import parameterized  # noqa: F401

        return
    except ImportError:
        pass
    wheels = upstream_cache_dir(version).parent / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with _file_lock(wheels / ".lock"):
        found = sorted(wheels.glob("parameterized-*.whl"))
        if not found:
            _run_pip(
                ["download", "parameterized>=0.9", "--only-binary", ":all:", "--no-deps", "-d", str(wheels)],
                "the `parameterized` wheel (a test dependency of transformers' common tests)",
            )
            found = sorted(wheels.glob("parameterized-*.whl"))
    if not found:
        raise UpstreamTestsUnavailable(f"no parameterized wheel in {wheels}")
    sys.path.append(str(found[-1]))  # a pure-Python wheel is a zip archive: importable as is
    importlib.invalidate_caches()


# --------------------------------------------------------------------------------------------------
# Importing
# --------------------------------------------------------------------------------------------------


def _install_stub_modules(upstream_dir: Path) -> None:
    """Register the package and stub the sibling modules that the sdist does not contain.

    Only modules whose file is missing from ``upstream_dir`` are stubbed. For 5.23.0 these are:

    * ``.exporters.test_export.ExportTesterMixin`` -- base class of ``ModelTesterMixin``. The real one
      only *adds* export tests (torch.export / ONNX / ExecuTorch ...); ``ModelTesterMixin`` never calls
      into it, so an empty base class just leaves those tests out.
    * ``.generation.test_utils.GenerationTesterMixin`` -- only used in ``issubclass`` checks by
      ``test_generation_tester_mixin_inheritance``; an empty class means "no generate() tests",
      which the harness states with an explicit skip for generative classes.
    * ``.utils.test_configuration_utils.config_common_kwargs`` -- only used by
      ``ConfigTester.check_config_arguments_init``, which builds a config from these kwargs and checks
      they are stored. The stub lists the v5 ``PreTrainedConfig`` fields with non-default values, so
      the check keeps its meaning for the base fields (the upstream dict may list a few more).
    """
    package = types.ModuleType(UPSTREAM_PACKAGE)
    package.__path__ = [str(upstream_dir)]
    package.__package__ = UPSTREAM_PACKAGE
    sys.modules[UPSTREAM_PACKAGE] = package

    class ExportTesterMixin:
        """Stub: the real mixin lives in tests/exporters/, which the sdist does not ship."""

    class GenerationTesterMixin:
        """Stub: the real mixin lives in tests/generation/, which the sdist does not ship."""

    config_common_kwargs: dict[str, Any] = {
        "return_dict": False,
        "output_hidden_states": True,
        "dtype": "float16",
        "chunk_size_feed_forward": 5,
        "architectures": ["BertModel"],
        "id2label": {0: "label"},
        "label2id": {"label": 0},
        "problem_type": "regression",
    }
    stubs: dict[str, dict[str, Any]] = {
        "exporters.test_export": {"ExportTesterMixin": ExportTesterMixin},
        "generation.test_utils": {"GenerationTesterMixin": GenerationTesterMixin},
        "utils.test_configuration_utils": {"config_common_kwargs": config_common_kwargs},
    }
    for dotted, attrs in stubs.items():
        if (upstream_dir / (dotted.replace(".", "/") + ".py")).is_file():
            continue  # a future sdist ships it: use the real module
        parent_name = UPSTREAM_PACKAGE
        for part in dotted.split("."):
            full_name = f"{parent_name}.{part}"
            module = sys.modules.get(full_name)
            if module is None:
                module = types.ModuleType(full_name)
                module.__path__ = []  # harmless on the leaf, needed on intermediate packages
                sys.modules[full_name] = module
                setattr(sys.modules[parent_name], part, module)
            parent_name = full_name
        for attr_name, value in attrs.items():
            value_module = sys.modules[parent_name]
            if isinstance(value, type):
                value.__module__ = parent_name
            setattr(value_module, attr_name, value)


def _isolate_mapping_tables(common: types.ModuleType) -> None:
    """Give the upstream module private copies of the ``*_MAPPING_NAMES`` tables it imported.

    The harness adds custom class names to these copies; transformers' own tables stay untouched.
    """
    for name, value in list(vars(common).items()):
        if name.endswith("_MAPPING_NAMES") and isinstance(value, dict):
            setattr(common, name, type(value)(value))


def load_upstream(version: str | None = None) -> tuple[types.ModuleType, types.ModuleType]:
    """Fetch (once), import and return ``(test_modeling_common, test_configuration_common)``.

    Raises ``UpstreamTestsUnavailable`` with a readable message on any failure.
    """
    modeling_name = f"{UPSTREAM_PACKAGE}.test_modeling_common"
    config_name = f"{UPSTREAM_PACKAGE}.test_configuration_common"
    if modeling_name in sys.modules and config_name in sys.modules:
        return sys.modules[modeling_name], sys.modules[config_name]
    version = version or transformers.__version__
    try:
        upstream_dir = fetch_upstream_tests(version)
        _ensure_parameterized(version)
        _install_stub_modules(upstream_dir)
        common = importlib.import_module(modeling_name)
        _isolate_mapping_tables(common)
        config_common = importlib.import_module(config_name)
    except UpstreamTestsUnavailable:
        raise
    except Exception as exc:  # import errors from API drift, tar errors, lock timeouts ...
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        raise UpstreamTestsUnavailable(
            f"importing the transformers {version} common tests failed: {detail}"
        ) from exc
    return common, config_common


def _failure_message(error: BaseException) -> str:
    return (
        f"Transformers' common model tests (tests/test_modeling_common.py of transformers "
        f"{transformers.__version__}) are unavailable, so the conformance tests cannot run.\n"
        f"Cause: {error}\n"
        f"Fix: give this machine access to PyPI for one run (the files are then cached in "
        f"{upstream_cache_dir()}), or place transformers-{transformers.__version__}.tar.gz in "
        f"{upstream_cache_dir() / 'sdist'}."
    )


_COMMON: types.ModuleType | None
_CONFIG_COMMON: types.ModuleType | None
_LOAD_ERROR: UpstreamTestsUnavailable | None
try:
    _COMMON, _CONFIG_COMMON = load_upstream()
    _LOAD_ERROR = None
except UpstreamTestsUnavailable as _exc:
    _COMMON = _CONFIG_COMMON = None
    _LOAD_ERROR = _exc


def load_training_mixin() -> type:
    """Upstream's ``TrainingTesterMixin`` (``tests/test_training_mixin.py`` of the sdist, the overfitting
    test).

    Raises ``UpstreamTestsUnavailable`` (with the fix) when the upstream tests could not be loaded.
    """
    if _LOAD_ERROR is not None:
        raise UpstreamTestsUnavailable(_failure_message(_LOAD_ERROR))
    try:
        return importlib.import_module(f"{UPSTREAM_PACKAGE}.test_training_mixin").TrainingTesterMixin
    except Exception as exc:  # API drift in a newer sdist
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        raise UpstreamTestsUnavailable(
            f"importing the transformers training tester mixin failed: {detail}") from exc


def upstream_load_error() -> UpstreamTestsUnavailable | None:
    """The error that prevented loading the upstream tests, or ``None`` if they are loaded."""
    return _LOAD_ERROR


if _COMMON is not None and _CONFIG_COMMON is not None:
    ModelTesterMixin: type = _COMMON.ModelTesterMixin
    ConfigTester: type = _CONFIG_COMMON.ConfigTester
    ids_tensor: Callable[..., Any] = _COMMON.ids_tensor
    random_attention_mask: Callable[..., Any] = _COMMON.random_attention_mask
    floats_tensor: Callable[..., Any] = _COMMON.floats_tensor
else:

    class ModelTesterMixin:  # type: ignore[no-redef]
        """Placeholder used when the upstream tests could not be loaded: its only test fails loudly."""

        def test_transformers_common_tests_available(self) -> None:
            assert _LOAD_ERROR is not None
            raise AssertionError(_failure_message(_LOAD_ERROR))

    def _unavailable(*_args: Any, **_kwargs: Any) -> Any:
        assert _LOAD_ERROR is not None
        raise UpstreamTestsUnavailable(_failure_message(_LOAD_ERROR))

    ConfigTester = _unavailable  # type: ignore[assignment]
    ids_tensor = random_attention_mask = floats_tensor = _unavailable


# --------------------------------------------------------------------------------------------------
# Task registration
# --------------------------------------------------------------------------------------------------

#: task -> (name table in test_modeling_common, Auto class name)
TASKS: dict[str, tuple[str, str]] = {
    "base": ("MODEL_MAPPING_NAMES", "AutoModel"),
    "masked-lm": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
    "causal-lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    "sequence-classification": (
        "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForSequenceClassification",
    ),
    "token-classification": (
        "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForTokenClassification",
    ),
    "question-answering": ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "AutoModelForQuestionAnswering"),
    "multiple-choice": ("MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES", "AutoModelForMultipleChoice"),
    "pretraining": ("MODEL_FOR_PRETRAINING_MAPPING_NAMES", "AutoModelForPreTraining"),
    "next-sentence-prediction": (
        "MODEL_FOR_NEXT_SENTENCE_PREDICTION_MAPPING_NAMES",
        "AutoModelForNextSentencePrediction",
    ),
}

_SUFFIX_TASKS: tuple[tuple[str, str], ...] = (
    ("ForMaskedLM", "masked-lm"),
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForSequenceClassification", "sequence-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForMultipleChoice", "multiple-choice"),
    ("ForPreTraining", "pretraining"),
    ("ForNextSentencePrediction", "next-sentence-prediction"),
)


def infer_task(model_class: type) -> str | None:
    """Infer the task of ``model_class`` from its name suffix (``None`` if it has no known suffix)."""
    name = model_class.__name__
    for suffix, task in _SUFFIX_TASKS:
        if name.endswith(suffix):
            return task
    if name.endswith("Model") and "For" not in name:
        return "base"
    return None


def _register_task_names(
    config_class: type[PreTrainedConfig], tasks: Mapping[type, str | None], register_auto: bool
) -> None:
    """Add class names to the upstream module's private name tables (and optionally to the Auto classes)."""
    if _COMMON is None:
        return
    model_type = config_class.model_type
    if not model_type:
        raise ValueError(f"{config_class.__name__}.model_type must be a non-empty string")
    if register_auto and model_type not in transformers.CONFIG_MAPPING:
        transformers.AutoConfig.register(model_type, config_class, exist_ok=True)
    for model_class, task in tasks.items():
        if task is None:
            continue
        table_name, auto_name = TASKS[task]
        table: dict[str, Any] = getattr(_COMMON, table_name)
        name = model_class.__name__
        if name not in _COMMON.get_values(table):
            existing = table.get(model_type)
            if existing is None:
                table[model_type] = name
            elif isinstance(existing, str):
                table[model_type] = (existing, name)
            else:
                table[model_type] = (*existing, name)
        auto_class = getattr(transformers, auto_name)
        if register_auto and config_class not in auto_class._model_mapping:
            auto_class.register(config_class, model_class, exist_ok=True)


# --------------------------------------------------------------------------------------------------
# Skips
# --------------------------------------------------------------------------------------------------


def _skip_targets(test_names: Sequence[str], key: str) -> list[str]:
    """Test names selected by a skip key: the exact name, or all ``parameterized`` expansions of it."""
    expansion = re.compile(re.escape(key) + r"_\d+(?:_.*)?$")
    return [name for name in test_names if name == key or expansion.match(name)]


def _apply_skips(cls: type, skips: Mapping[str, str]) -> None:
    """Replace each selected test method of ``cls`` by a ``unittest.skip(reason)`` version."""
    test_names = sorted(
        name for name in dir(cls) if name.startswith("test_") and callable(getattr(cls, name))
    )
    for key, reason in skips.items():
        if not isinstance(reason, str) or not reason.strip() or "\n" in reason.strip():
            raise ValueError(
                f"{cls.__name__}.skip_tests[{key!r}] needs a non-empty one-line reason, got {reason!r}"
            )
        targets = _skip_targets(test_names, key)
        if not targets:
            raise ValueError(f"{cls.__name__}.skip_tests has {key!r}, which matches no test of this class")
        for name in targets:
            setattr(cls, name, unittest.skip(reason.strip())(getattr(cls, name)))


# --------------------------------------------------------------------------------------------------
# Model tester
# --------------------------------------------------------------------------------------------------


class ModelTester:
    """Tiny config + common inputs for a text model, like upstream's ``BertModelTester``.

    Args:
        parent: the running ``unittest.TestCase``.
        config_class / config_kwargs: the config is ``config_class(**deepcopy(config_kwargs))``, rebuilt
            on every call (upstream tests mutate it).
        batch_size / seq_length: input shape (``seq_length`` must not exceed the position limit).
        is_training: enables ``test_training*`` and the gradient-checkpointing tests.
        use_input_mask: add a random ``attention_mask`` (first token always kept).
        use_token_type_ids: add ``token_type_ids`` in ``[0, config.type_vocab_size)``.
        num_choices: multiple-choice fan-out (upstream ``_prepare_for_class`` reads it).
        attrs: extra / overriding tester attributes, e.g. ``{"num_attention_heads": 1}`` for a
            single-head model whose config has no such field, ``key_length``, ``chunk_length``,
            ``expected_num_hidden_layers``.

    The attributes the upstream tests read (``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``type_vocab_size``, ``num_labels``, ``pad_token_id``) are taken from the
    config unless given in ``attrs``. Subclass and override :meth:`prepare_inputs_dict` for extra inputs.
    """

    # Copied from the config (or ``attrs``) in ``__init__``; absent when neither defines them.
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    type_vocab_size: int
    num_labels: int
    pad_token_id: int | None

    def __init__(
        self,
        parent: unittest.TestCase,
        config_class: type[PreTrainedConfig],
        config_kwargs: Mapping[str, Any],
        *,
        batch_size: int = 13,
        seq_length: int = 7,
        is_training: bool = True,
        use_input_mask: bool = True,
        use_token_type_ids: bool = False,
        num_choices: int = 4,
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        self.parent = parent
        self.config_class = config_class
        self.config_kwargs = dict(config_kwargs)
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.use_input_mask = use_input_mask
        self.use_token_type_ids = use_token_type_ids
        self.num_choices = num_choices
        probe = self.get_config()
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "type_vocab_size",
            "num_labels",
            "pad_token_id",
        ):
            if hasattr(probe, name):
                setattr(self, name, getattr(probe, name))
        for name, value in (attrs or {}).items():
            setattr(self, name, value)

    def get_config(self) -> PreTrainedConfig:
        """A fresh tiny config."""
        return self.config_class(**copy.deepcopy(self.config_kwargs))

    def prepare_inputs_dict(self, config: PreTrainedConfig) -> dict[str, Any]:
        """The model inputs used by every common test (no labels: ``_prepare_for_class`` adds them)."""
        inputs: dict[str, Any] = {
            "input_ids": ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        }
        if self.use_input_mask:
            inputs["attention_mask"] = random_attention_mask([self.batch_size, self.seq_length])
        if self.use_token_type_ids:
            inputs["token_type_ids"] = ids_tensor([self.batch_size, self.seq_length], self.type_vocab_size)
        return inputs

    def prepare_config_and_inputs_for_common(self) -> tuple[PreTrainedConfig, dict[str, Any]]:
        """Entry point used by ``ModelTesterMixin``."""
        config = self.get_config()
        return config, self.prepare_inputs_dict(config)


# --------------------------------------------------------------------------------------------------
# Test-case mixin and factory
# --------------------------------------------------------------------------------------------------


class CommonModelTest(ModelTesterMixin):  # type: ignore[misc, valid-type]
    """``ModelTesterMixin`` plus the registration, skip handling and defaults described above.

    Use as ``class TestX(CommonModelTest, unittest.TestCase)`` or through :func:`make_common_test_case`.
    """

    config_class: ClassVar[type[PreTrainedConfig] | None] = None
    config_kwargs: ClassVar[Mapping[str, Any]] = {}
    model_tester_class: ClassVar[type[ModelTester]] = ModelTester
    model_tester_kwargs: ClassVar[Mapping[str, Any]] = {}
    model_tasks: ClassVar[Mapping[type, str | None]] = {}
    skip_tests: ClassVar[Mapping[str, str]] = {}
    register_auto_classes: ClassVar[bool] = True
    config_tester_kwargs: ClassVar[Mapping[str, Any] | None] = {}
    # Custom configs rarely carry a "# Copyright 20xx" header: without this upstream would skip the
    # `_init_weights` coverage test.
    test_can_init_all_missing_weights_before_2023 = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _COMMON is None or cls.config_class is None or not cls.all_model_classes:
            return  # placeholder mode or an intermediate base class
        tasks: dict[type, str | None] = {}
        for model_class in cls.all_model_classes:
            if model_class in cls.model_tasks:
                task = cls.model_tasks[model_class]
            else:
                task = infer_task(model_class)
                if task is None:
                    raise ValueError(
                        f"{cls.__name__}: cannot infer the task of {model_class.__name__} from its name; "
                        f"declare it in model_tasks as one of {sorted(TASKS)} or None"
                    )
            if task is not None and task not in TASKS:
                raise ValueError(f"{cls.__name__}: unknown task {task!r} for {model_class.__name__}")
            tasks[model_class] = task
        _register_task_names(cls.config_class, tasks, cls.register_auto_classes)
        skips: dict[str, str] = {}
        if any(model_class.can_generate() for model_class in cls.all_model_classes):
            skips["test_generation_tester_mixin_inheritance"] = (
                "no GenerationTesterMixin in the transformers sdist (stubbed): generate() is not covered here"
            )
        skips.update(cls.skip_tests)
        _apply_skips(cls, skips)

    def setUp(self) -> None:
        if _LOAD_ERROR is not None:
            self.fail(_failure_message(_LOAD_ERROR))
        super().setUp()
        if self.config_class is None:
            raise TypeError(f"{type(self).__name__} must set config_class")
        self.model_tester = self.model_tester_class(
            self, self.config_class, self.config_kwargs, **self.model_tester_kwargs
        )

    def test_config(self) -> None:
        """Upstream ``ConfigTester.run_common_tests`` on ``config_kwargs``."""
        configured = self.config_tester_kwargs
        if configured is None:
            raise unittest.SkipTest("config_tester_kwargs is None: ConfigTester disabled for this class")
        options = copy.deepcopy(dict(configured))  # ConfigTester extends `common_properties` in place
        can_init_without_params = options.pop("can_init_without_params", True)
        tester = ConfigTester(
            self, config_class=self.config_class, **options, **copy.deepcopy(self.config_kwargs)
        )
        tester.run_common_tests(can_init_without_params=can_init_without_params)


def make_common_test_case(
    name: str,
    *,
    config_class: type[PreTrainedConfig],
    config_kwargs: Mapping[str, Any],
    all_model_classes: Sequence[type[PreTrainedModel]],
    model_tester_kwargs: Mapping[str, Any] | None = None,
    model_tester_class: type[ModelTester] = ModelTester,
    skip_tests: Mapping[str, str] | None = None,
    model_tasks: Mapping[type, str | None] | None = None,
    mixin_attrs: Mapping[str, Any] | None = None,
    config_tester_kwargs: Mapping[str, Any] | None = None,
    run_config_tests: bool = True,
    register_auto_classes: bool = True,
    module: str | None = None,
) -> type[unittest.TestCase]:
    """Build a ``unittest.TestCase`` running the upstream common tests on ``all_model_classes``.

    Args:
        name: class name; assign the result to a module-level variable of the same name.
        config_class / config_kwargs: tiny config (``num_hidden_layers <= 2``, < 1M parameters).
        all_model_classes: the classes under test (the base model first is customary).
        model_tester_kwargs: keyword arguments of :class:`ModelTester` (``batch_size``, ``seq_length``,
            ``is_training``, ``use_input_mask``, ``use_token_type_ids``, ``num_choices``, ``attrs``).
        model_tester_class: a :class:`ModelTester` subclass, for extra inputs.
        skip_tests: ``{"test_name": "one-line reason"}`` (see the module docstring).
        model_tasks: ``{model_class: task | None}`` overriding the name-based task inference.
        mixin_attrs: upstream class attributes, e.g. ``{"has_attentions": False,
            "test_resize_embeddings": False}``.
        config_tester_kwargs: ``ConfigTester`` options (``common_properties``, ``has_text_modality``,
            ``can_init_without_params``).
        run_config_tests: ``False`` skips ``test_config``.
        register_auto_classes: register config/classes with the Auto classes if not yet registered.
        module: ``__module__`` of the new class (default: the caller's module).
    """
    if module is None:
        module = sys._getframe(1).f_globals.get("__name__", __name__)
    namespace: dict[str, Any] = {
        "__module__": module,
        "__qualname__": name,
        "config_class": config_class,
        "config_kwargs": dict(config_kwargs),
        "all_model_classes": tuple(all_model_classes),
        "model_tester_class": model_tester_class,
        "model_tester_kwargs": dict(model_tester_kwargs or {}),
        "model_tasks": dict(model_tasks or {}),
        "skip_tests": dict(skip_tests or {}),
        "register_auto_classes": register_auto_classes,
        "config_tester_kwargs": dict(config_tester_kwargs or {}) if run_config_tests else None,
        **dict(mixin_attrs or {}),
    }
    return type(name, (CommonModelTest, unittest.TestCase), namespace)
