"""Load exported folders with ``trust_remote_code=True`` in environments without this package.

``clean_python(version)`` creates (once, cached under ``$HF_ATTN_VARIANTS_CACHE`` or
``~/.cache/hf_attn_variants``) a virtual environment holding only torch, safetensors (and pytest/hypothesis)
at the versions installed here and the given Transformers release, with their dependencies, never this
package, and ``assert_remote_code_matches`` saves each model, loads it there through the named Auto class —
for every release of ``releases_under_test()`` — and checks the outputs (and, for causal LMs, greedy
``generate`` tokens) equal the originals; each loaded model is saved again there with Transformers' own
``save_pretrained`` (the same code files, byte for byte) and reloaded to the same outputs.

The Transformers releases the exported code is tested on are listed once, in ``TRANSFORMERS_RELEASES``.
``make test`` runs the oldest and the installed one; ``HF_ATTN_VARIANTS_REMOTE_RELEASES=all`` runs every
one (or give a comma-separated list).

Usage from a family's tests::

    cases = [RemoteCase("mlm", model, "AutoModelForMaskedLM", {"input_ids": ids})]
    assert_remote_code_matches(cases, tmp_path)
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from filelock import FileLock
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from transformers import PreTrainedModel

import hf_attn_variants
from hf_attn_variants import AUTO_CLASSES

OUTPUT_KEYS = ("last_hidden_state", "logits", "start_logits", "end_logits")

TRANSFORMERS_RELEASES = ("5.0.0", "5.5.4", "5.10.4", "5.17.0", "5.23.0", "5.24.0")
"""Releases the exported model code is tested on besides the installed one, oldest first; the first is
``hf_attn_variants.models.compat.MIN_TRANSFORMERS_VERSION`` (checked by a test)."""

GENERATE_TOKENS = 5

CHILD_SCRIPT = r"""
import importlib.util, json, os, sys
from pathlib import Path
import torch, transformers
assert importlib.util.find_spec("hf_attn_variants") is None, "hf_attn_variants must not be importable here"
manifest = json.load(open(sys.argv[1]))
for case in manifest:
    auto_class = getattr(transformers, case["auto_class"])
    model = auto_class.from_pretrained(case["folder"], trust_remote_code=True).eval()
    assert not type(model).__module__.startswith("hf_attn_variants"), type(model).__module__
    inputs = torch.load(case["inputs"])
    with torch.no_grad():
        out = model(**inputs)
        result = {k: out[k] for k in case["keys"]}
        if case["generate"]:
            result["generated"] = model.generate(**inputs, max_new_tokens=case["generate"], do_sample=False)
    torch.save(result, case["outputs"])
    print("loaded", case["name"], type(model).__name__, type(model).__module__)
    # Saved again with Transformers' own save_pretrained (no hf_attn_variants here): the same code files, byte
    # for byte, and a folder that loads to the same outputs.
    folder, resaved = Path(case["folder"]), Path(os.getcwd()) / f"{case['name']}-resaved"
    model.save_pretrained(resaved)
    code = sorted(path.name for path in folder.glob("*.py"))
    assert sorted(path.name for path in resaved.glob("*.py")) == code, sorted(resaved.glob("*.py"))
    for name in code:
        assert (resaved / name).read_bytes() == (folder / name).read_bytes(), f"{name} changed, saved again"
    again = auto_class.from_pretrained(resaved, trust_remote_code=True).eval()
    with torch.no_grad():
        out = again(**inputs)
    for key in case["keys"]:
        assert torch.equal(out[key], result[key]), f"{case['name']}.{key} differs after saving again"
"""


def assert_standalone_code(folder: Path, family: str, *, model: bool = True) -> None:
    """The folder's code is ``configuration_<family>.py`` and the shared file (+ ``modeling_<family>.py``, and
    for GAU ``gau_kernels.py`` and ``gau_triton.py``), each generated with a header, importing only torch,
    transformers and the standard library outside ``try`` blocks (optional packages, which Transformers'
    import check skips too), and relatively only the shared file, ``.configuration_<family>`` (the modeling
    file) and GAU's kernel files (GAU's modeling file; the op imports its Triton kernels). The shared file
    is the same bytes for every family: the package's ``shared_bundle``."""
    from hf_attn_variants.models.standalone import SHARED_FILE, shared_bundle

    expected = {f"configuration_{family}.py", f"{SHARED_FILE}.py"}
    if model:
        expected |= {f"modeling_{family}.py", *(["gau_kernels.py", "gau_triton.py"] * (family == "gau"))}
    assert {p.name for p in Path(folder).glob("*.py")} == expected
    assert (Path(folder) / f"{SHARED_FILE}.py").read_text() == shared_bundle().text
    allowed = {f"configuration_{family}.py": {SHARED_FILE}, f"{SHARED_FILE}.py": set(),
               "gau_triton.py": set(), "gau_kernels.py": {SHARED_FILE, "gau_triton"},
               f"modeling_{family}.py": {SHARED_FILE, f"configuration_{family}", "gau_kernels", "gau_triton"}}
    for name in expected:
        source = (Path(folder) / name).read_text()
        assert source.startswith(
            f"# Generated by hf_attn_variants {hf_attn_variants.__version__} from "), name
        assert "hf_attn_variants.models" in source.splitlines()[2] and "DESIGN" not in source
        tree = ast.parse(source)
        optional = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for n in ast.walk(t)}
        for node in ast.walk(tree):
            if id(node) in optional:  # optional imports (triton), ignored by Transformers' import check too
                continue
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and node.module in allowed[name], (name, node.module)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                for module in modules:
                    top = module.split(".")[0]
                    assert (top in ("torch", "transformers", "__future__")
                            or top in sys.stdlib_module_names), module


def auto_class_name(suffix: str) -> str:
    """Name of the Auto class for a family class suffix (``"ForMaskedLM"`` → ``"AutoModelForMaskedLM"``)."""
    return AUTO_CLASSES[suffix].__name__


@dataclass
class RemoteCase:
    """One model to export and reload: ``auto_class`` is the name of a transformers Auto class."""

    name: str
    model: PreTrainedModel
    auto_class: str
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    generate: bool = False


def class_case(suffix: str, model: PreTrainedModel, inputs: dict[str, torch.Tensor]) -> RemoteCase:
    """The case of a family class (``suffix`` as in ``AUTO_CLASSES``); a causal LM also compares
    ``generate``."""
    return RemoteCase(suffix, model, auto_class_name(suffix), inputs, generate=suffix == "ForCausalLM")


def cache_root() -> Path:
    """Where cached environments live."""
    root = Path(os.environ.get("HF_ATTN_VARIANTS_CACHE", Path.home() / ".cache" / "hf_attn_variants"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def installed_transformers() -> str:
    """The (public) version of the Transformers installed here."""
    return importlib.metadata.version("transformers").split("+")[0]


def releases_under_test() -> list[str]:
    """Transformers releases to load exported folders with: the oldest supported and the installed one.

    ``HF_ATTN_VARIANTS_REMOTE_RELEASES=all`` adds every release of ``TRANSFORMERS_RELEASES``; a
    comma-separated list picks releases explicitly.
    """
    chosen = os.environ.get("HF_ATTN_VARIANTS_REMOTE_RELEASES", "").strip()
    if chosen == "all":
        releases = [*TRANSFORMERS_RELEASES, installed_transformers()]
    elif chosen:
        releases = [release.strip() for release in chosen.split(",") if release.strip()]
    else:
        releases = [TRANSFORMERS_RELEASES[0], installed_transformers()]
    return list(dict.fromkeys(releases))


TEST_RUNNERS = ("pytest", "hypothesis")
"""Installed in the clean environments too, so the model tests can run there against an older Transformers
(tests/test_transformers_floor.py); they import nothing of this package."""


def pinned_requirements(transformers_version: str | None = None,
                        torch_version: str | None = None) -> list[str]:
    """safetensors and the test runners at the installed (public) versions, transformers at
    ``transformers_version`` and torch at ``torch_version`` (each defaulting to the installed one)."""
    names = ("torch", "transformers", "safetensors", *TEST_RUNNERS)
    versions = {name: importlib.metadata.version(name).split("+")[0] for name in names}
    versions["transformers"] = transformers_version or versions["transformers"]
    versions["torch"] = torch_version or versions["torch"]
    return [f"{name}=={version}" for name, version in versions.items()]


def distribution_closure(name: str) -> list[importlib.metadata.Distribution]:
    """The distribution ``name`` installed here and, recursively, the installed distributions it requires
    (requirements behind an ``extra`` or a marker false here left out), each once, ``name`` first."""
    found: dict[str, importlib.metadata.Distribution] = {}
    pending = [name]
    while pending:
        key = canonicalize_name(pending.pop())
        if key in found:
            continue
        try:
            found[key] = importlib.metadata.distribution(key)
        except importlib.metadata.PackageNotFoundError:
            continue  # pip installs it
        for line in found[key].requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return list(found.values())


def seed_distributions(env_dir: Path, names: tuple[str, ...]) -> None:
    """Put the distributions ``names`` installed here, with their dependencies (``distribution_closure``),
    into the new virtual environment ``env_dir`` as hard links to this environment's files (copies across
    file systems), byte-compiled files included: what ``pip install`` would unpack and compile again
    (CONTRIBUTING.md, the paragraph on caches, gives what that saves). pip then finds them installed. A
    distribution the new environment already has (the ``setuptools`` of ``ensurepip``) is left to pip, and so
    is every file outside ``site-packages`` but console scripts, which are written with the new environment's
    interpreter."""
    (site,) = env_dir.glob("lib/python*/site-packages")
    installed = importlib.metadata.distributions(path=[str(site)])
    present = {canonicalize_name(d.metadata["Name"]) for d in installed}
    for name in names:
        for dist in distribution_closure(name):
            if canonicalize_name(dist.metadata["Name"]) in present:
                continue
            for file in dist.files or []:
                source = Path(dist.locate_file(file))
                if file.parts[0] == "..":
                    if file.parts[-2] == "bin" and source.is_file():
                        script = env_dir / "bin" / file.name
                        first, newline, rest = source.read_bytes().partition(b"\n")
                        if first.startswith(b"#!"):
                            first = f"#!{env_dir / 'bin' / 'python'}".encode()
                        script.write_bytes(first + newline + rest)
                        script.chmod(source.stat().st_mode)
                    continue
                target = site / file
                if not source.is_file() or target.exists():
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(source, target)
                except OSError:
                    shutil.copy2(source, target)
            present.add(canonicalize_name(dist.metadata["Name"]))


def installed_here(requirements: list[str]) -> tuple[str, ...]:
    """The names of the ``name==version`` requirements that this environment has at that (public) version:
    the ones ``seed_distributions`` can link in."""
    names = []
    for line in requirements:
        requirement = Requirement(line)
        try:
            version = importlib.metadata.version(requirement.name).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            continue
        if str(requirement.specifier) == f"=={version}":
            names.append(requirement.name)
    return tuple(names)


def frozen_pins(text: str) -> list[str]:
    """The ``name==version`` lines of a ``pip freeze`` (a lock's text), comments left out."""
    return [line.strip() for line in text.splitlines() if "==" in line and not line.lstrip().startswith("#")]


def cached_venv(tag: str, install: Callable[[Callable[..., str]], object],
                seed: tuple[str, ...] = ()) -> Path:
    """Path to the Python of the virtual environment ``cache_root()/tag``, created once: the distributions
    ``seed`` installed here are linked in (``seed_distributions``), then ``install(pip)`` fills it, where
    ``pip(*args)`` runs that environment's pip (outside this one's ``PYTHONPATH``/``VIRTUAL_ENV``), returns
    its output and raises when it fails. A file lock lets parallel xdist workers build it once; ``.ready``
    marks a finished build."""
    env_dir = cache_root() / tag
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def pip(*args: str) -> str:
        result = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args], check=False,
                                env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building {env_dir}: pip {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    with FileLock(cache_root() / f"{tag}.lock"):
        if not (env_dir / ".ready").exists():
            venv.create(env_dir, with_pip=True, clear=True)
            seed_distributions(env_dir, seed)
            install(pip)
            (env_dir / ".ready").touch()
    return python


def clean_python(transformers_version: str | None = None, torch_version: str | None = None) -> Path:
    """Path to the Python of the cached clean environment for ``transformers_version`` and ``torch_version``
    (default: the installed ones), created on first use: each pinned package that this environment has at its
    version is linked in from here with its dependencies (``seed_distributions``: about 10 s for the installed
    Transformers, 20 s for another release, which pip installs). Another torch comes from the package index:
    on x86-64 Linux that is a CUDA build of several GB, which runs on the CPU (``scripts/compat.py
    --torch``)."""
    requirements = pinned_requirements(transformers_version, torch_version)
    tag = ("-".join(r.replace("==", "") for r in requirements)
           + f"-py{sys.version_info[0]}{sys.version_info[1]}")
    return cached_venv(f"clean-env-{tag}", lambda pip: pip("install", "--quiet", *requirements),
                       seed=installed_here(requirements))


CLIENT_PACKAGES = ("sentence-transformers==6.2.0", "lm-eval==0.4.13", "accelerate==1.15.0", "mteb==2.26.24",
                   "onnx==1.23.2", "onnxruntime==1.32.0", "onnxscript==0.7.2")
"""The client tools of tests/test_clients.py; every other package of their environment is pinned by
``locks/clients.txt``."""
CLIENT_LOCK = Path(__file__).resolve().parents[1] / "locks" / "clients.txt"


def clean_python_with(packages: tuple[str, ...] | list[str], name: str,
                      constraints: Path | None = None) -> Path:
    """Path to the Python of a cached clean environment holding ``pinned_requirements()`` (torch,
    transformers, safetensors and the test runners at the versions installed here) plus ``packages``, resolved
    under the pip constraint file ``constraints`` (the ``pip freeze`` of such an environment); never this
    package. The pinned packages, and each package of ``constraints`` that this environment has at that
    version, are linked in from here first (``seed_distributions``); pip replaces any of their dependencies
    that ``constraints`` pins otherwise. Created on first use under ``cache_root()``; a change of the
    packages, the pins or the constraint file's text makes a new one."""

    requirements = [*pinned_requirements(), *packages]
    text = constraints.read_text() if constraints is not None else ""
    digest = hashlib.sha256("\n".join([*requirements, text]).encode()).hexdigest()[:12]
    tag = f"{name}-{digest}-py{sys.version_info[0]}{sys.version_info[1]}"
    constraint_args = ["-c", str(constraints)] if constraints is not None else []
    return cached_venv(tag, lambda pip: pip("install", "--quiet", *constraint_args, *requirements),
                       seed=installed_here([*requirements, *frozen_pins(text)]))


def client_python() -> Path:
    """The cached environment of the client tools (``CLIENT_PACKAGES`` under ``locks/clients.txt``)."""
    return clean_python_with(CLIENT_PACKAGES, "clients-env", CLIENT_LOCK)


def assert_remote_code_matches(
    cases: list[RemoteCase], tmp_path: Path, atol: float = 1e-5, releases: list[str] | None = None
) -> None:
    """Export every case, load it in the clean environment of each release and compare with the original.

    ``releases`` defaults to ``releases_under_test()``. Every release runs before the first mismatch is
    reported, and the message names each (release, case, output) that differs.
    """
    manifest, expected = [], {}
    for case in cases:
        folder = tmp_path / case.name
        case.model.eval().save_pretrained(folder)
        with torch.no_grad():
            out = case.model(**case.inputs)
            expected[case.name] = {k: out[k] for k in OUTPUT_KEYS if out.get(k) is not None}
            if case.generate:
                expected[case.name]["generated"] = case.model.generate(
                    **case.inputs, max_new_tokens=GENERATE_TOKENS, do_sample=False
                )
        torch.save(case.inputs, tmp_path / f"{case.name}.inputs.pt")
        manifest.append(
            {
                "name": case.name,
                "folder": str(folder),
                "auto_class": case.auto_class,
                "inputs": str(tmp_path / f"{case.name}.inputs.pt"),
                "keys": [k for k in expected[case.name] if k != "generated"],
                "generate": GENERATE_TOKENS if case.generate else 0,
            }
        )
    (tmp_path / "child.py").write_text(CHILD_SCRIPT)
    problems = []
    for release in releases or releases_under_test():
        problems += _mismatches(release, manifest, expected, tmp_path, atol)
    assert not problems, "remote-code loading differs:\n" + "\n".join(problems)


def _mismatches(
    release: str, manifest: list[dict], expected: dict[str, dict[str, torch.Tensor]], tmp_path: Path,
    atol: float
) -> list[str]:
    """Load the manifest's folders with Transformers ``release``; one line per failure or differing output."""
    run = tmp_path / f"transformers-{release}"
    run.mkdir()
    cases = [{**case, "outputs": str(run / f"{case['name']}.outputs.pt")} for case in manifest]
    (run / "manifest.json").write_text(json.dumps(cases))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(run / "hf_modules"), TRANSFORMERS_VERBOSITY="error")
    result = subprocess.run(
        [str(clean_python(release)), str(tmp_path / "child.py"), str(run / "manifest.json")],
        cwd=run,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        return [f"transformers {release}: loading failed:\n{result.stdout}\n{result.stderr[-4000:]}"]
    problems = []
    for case in cases:
        got = torch.load(case["outputs"])
        for key, value in expected[case["name"]].items():
            same = (torch.equal(got[key], value) if key == "generated"
                    else torch.allclose(got[key], value, atol=atol))
            if not same:
                problems.append(f"transformers {release}: {case['name']}.{key} differs after "
                                "remote-code load")
    return problems
