"""Glue between dataclass arguments, ``HfArgumentParser`` and the ``hf-attn-variants`` sub-parsers.

Bad values. Every subcommand validates its flags before it writes anything; a bad value raises
``FlagError`` (a ``ValueError`` naming the flag), which the subcommand's ``run`` turns into ONE line on
stderr, ``hf-attn-variants <command>: error: --<flag>…``, and exit status 2 (``fail_flag``) — the same
status as argparse's own type/choice errors. Only ``FlagError`` is caught that way: any other exception is
a bug and keeps its traceback. The checks shared by several subcommands live here (paths, ranges, seeds).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

MAX_SEED = 2**32 - 1
"""Largest seed every RNG seeded from a flag accepts (``numpy.random.seed`` takes [0, 2**32 - 1])."""


class FlagError(ValueError):
    """A bad value of the command-line flag ``--<flag>`` (or of the same-named Python argument).

    ``str(error)`` is the message, as for any ``ValueError``; ``flag`` is the flag's name without the
    leading dashes, spelled as on the command line (``"config_overrides"``, ``"report-only"``).
    """

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag


def flag_message(error: FlagError) -> str:
    """``error`` as one line naming ``--<flag>``: ``"--x must be …"`` when the message starts with the flag's
    name, the message itself when it already starts with ``--x``, else ``"--x: <message>"``."""
    message = " ".join(str(error).split())
    option = f"--{error.flag}"
    if re.match(rf"{re.escape(option)}(?![\w-])", message):
        return message
    if re.match(rf"{re.escape(error.flag)}(?![\w-])", message):
        return "--" + message
    return f"{option}: {message}"


def error_reason(error: BaseException, limit: int = 400) -> str:
    """What ``error`` says, for the end of a one-line message: its lines joined (a library's reason often
    spans several, and its first may end in "one of:"), cut to ``limit`` characters with "…", or the
    exception's class name when it says nothing."""
    reason = " ".join(str(error).split())
    if not reason:
        return type(error).__name__
    return reason if len(reason) <= limit else reason[:limit - 1].rstrip() + "…"


def fail(command: str, message: str, label: str = "error") -> int:
    """Print ``hf-attn-variants <command>: <label>: <message>`` (on one line) on stderr and return exit code 2
    (argparse's)."""
    print(f"hf-attn-variants {command}: {label}: {' '.join(message.split())}", file=sys.stderr)
    return 2


def fail_flag(command: str, error: FlagError) -> int:
    """``fail`` with the line that names the flag of ``error``."""
    return fail(command, flag_message(error))


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """No progress bars from ``datasets`` (``map``, file reading; when it is installed) or ``transformers``
    (weight loading) inside the block: a command's checks run in it, so that a bad value prints its one error
    line alone."""
    import importlib.util

    from transformers.utils import logging as transformers_logging

    datasets = None
    if importlib.util.find_spec("datasets") is not None:  # the train extra; export runs without it
        import datasets
    datasets_bars = datasets is not None and not datasets.are_progress_bars_disabled()
    transformers_bars = transformers_logging.is_progress_bar_enabled()
    if datasets is not None:
        datasets.disable_progress_bars()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if datasets_bars:
            datasets.enable_progress_bars()
        if transformers_bars:
            transformers_logging.enable_progress_bar()


# ---------------------------------------------------------------- dataclass flags
def add_dataclass_arguments(parser: argparse.ArgumentParser, *dataclass_types: type) -> None:
    """Add one ``--flag`` per field of each dataclass to ``parser``, with the rules of ``HfArgumentParser``
    (types, ``choices`` for ``Literal``/``Enum`` fields, ``--flag [bool]`` and ``--no_flag`` for booleans
    defaulting to True, ``nargs="+"`` for lists, ``--flag-with-dashes`` aliases, help texts), through
    ``parser.add_argument`` only. ``tests/test_cli_utils.py`` checks the flags equal ``HfArgumentParser``'s
    for every subcommand's dataclasses.

    One difference in the flags: a ``bool | None`` flag (``TrainingArguments``' ``--disable_tqdm``, …) given
    alone means True, as every other boolean flag does; ``HfArgumentParser`` stops with "expected one
    argument" there. Two differences in the help text: a dataclass with ``argument_groups`` (title → field
    names, in the order they are shown; every field listed once) shows its flags in those argparse groups, and
    a dataclass without them next to one that has them gets a group titled after its class; a help text names
    the default unless the flag is required or its default is None (nothing to show).
    """
    grouped = any(getattr(dtype, "argument_groups", None) for dtype in dataclass_types)
    for dtype in dataclass_types:
        hints = typing.get_type_hints(dtype)
        fields = {field.name: field for field in dataclasses.fields(dtype) if field.init}
        for title, names in field_groups(dtype, list(fields), grouped):
            target = parser.add_argument_group(title) if title else parser
            for name in names:
                for options, kwargs in field_arguments(fields[name], hints[name]):
                    target.add_argument(*options, **with_default_in_help(kwargs))


def field_groups(dtype: type, names: list[str], grouped: bool) -> list[tuple[str | None, list[str]]]:
    """``(group title or None, field names)`` in the order ``add_dataclass_arguments`` shows them;
    ``ValueError`` when ``dtype.argument_groups`` misses a field, lists one twice or names one that does not
    exist."""
    groups = getattr(dtype, "argument_groups", None)
    if groups:
        listed = [name for members in groups.values() for name in members]
        if sorted(listed) != sorted(names):
            raise ValueError(f"{dtype.__name__}.argument_groups must list every field once: missing "
                             f"{sorted(set(names) - set(listed))}, unknown or repeated "
                             f"{sorted({n for n in listed if listed.count(n) > 1 or n not in names})}.")
        return [(title, list(members)) for title, members in groups.items()]
    title = getattr(dtype, "_argument_group_name", None) or (dtype.__name__ if grouped else None)
    return [(title, names)]


def with_default_in_help(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with `` (default: …)`` appended to the help text, as ``ArgumentDefaultsHelpFormatter`` does,
    except for a required flag, a default of None, a flag without help, or a help that names its default."""
    text = kwargs.get("help")
    if (not text or "%(default)" in text or kwargs.get("required") or kwargs.get("default") is None
            or kwargs.get("default") is argparse.SUPPRESS):
        return kwargs
    return {**kwargs, "help": f"{text} (default: %(default)s)"}


def _field_default(field: dataclasses.Field) -> Any:
    """The field's default (``default_factory()`` called), or ``dataclasses.MISSING``."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _argument_type(field_type: Any, name: str) -> Any:
    """The one type a flag parses into: ``X`` of ``X | None``, the non-``str`` member of ``X | str``."""
    if typing.get_origin(field_type) not in (typing.Union, types.UnionType):
        return field_type
    members = typing.get_args(field_type)
    if str not in members and (len(members) != 2 or type(None) not in members):
        raise ValueError(f"Field {name!r}: only X | None (or a union with str) can be one command-line flag.")
    if type(None) not in members:
        return members[0] if members[1] is str else members[1]
    if bool in members:  # bool | None keeps its None
        return field_type
    return members[0] if members[1] is type(None) else members[1]


def field_arguments(field: dataclasses.Field, field_type: Any) -> list[tuple[list[str], dict[str, Any]]]:
    """``(option strings, add_argument keyword arguments)`` of the flag(s) of one dataclass field, following
    ``HfArgumentParser``: the flag and its dashed alias, ``metadata`` as keyword arguments (``aliases`` as
    more option strings), and for a boolean defaulting to True a ``--no_<name>`` flag storing False."""
    from transformers.hf_argparser import make_choice_type_function, string_to_bool

    options = [f"--{field.name}"] + ([f"--{field.name.replace('_', '-')}"] if "_" in field.name else [])
    kwargs = dict(field.metadata)
    aliases = kwargs.pop("aliases", [])
    options += [aliases] if isinstance(aliases, str) else list(aliases)
    bool_kwargs = dict(kwargs)
    field_type = _argument_type(field_type, field.name)
    origin = typing.get_origin(field_type) or field_type
    default = _field_default(field)
    is_bool = field_type is bool or field_type == (bool | None)
    if origin is typing.Literal or (isinstance(field_type, type) and issubclass(field_type, enum.Enum)):
        kwargs["choices"] = (typing.get_args(field_type) if origin is typing.Literal
                             else [x.value for x in field_type])
        kwargs["type"] = make_choice_type_function(kwargs["choices"])
        if field.default is not dataclasses.MISSING:
            kwargs["default"] = field.default
        else:
            kwargs["required"] = True
    elif is_bool:  # given alone, True; HfArgumentParser wants a value after a bool | None flag
        kwargs["type"] = string_to_bool
        kwargs["nargs"] = "?"
        kwargs["const"] = True
        if field_type is bool or (field.default is not None and field.default is not dataclasses.MISSING):
            kwargs["default"] = False if field.default is dataclasses.MISSING else field.default
    elif isinstance(origin, type) and issubclass(origin, list):
        kwargs["type"] = typing.get_args(field_type)[0]
        kwargs["nargs"] = "+"
        if field.default_factory is not dataclasses.MISSING:
            kwargs["default"] = field.default_factory()
        elif field.default is dataclasses.MISSING:
            kwargs["required"] = True
    else:
        kwargs["type"] = field_type
        if default is dataclasses.MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
    arguments = [(options, kwargs)]
    if field.default is True and is_bool:
        negative = [f"--no_{field.name}", f"--no-{field.name.replace('_', '-')}"]
        arguments.append((negative,
                          {**bool_kwargs, "default": False, "action": "store_false", "dest": field.name}))
    return arguments


DATACLASS_ERRORS = (ValueError, TypeError, OSError, ImportError)
"""What constructing an argument dataclass raises for a bad value: our ``__post_init__`` checks
(``FlagError``), and ``TrainingArguments``' own (``ValueError``, ``FileNotFoundError`` for a missing
``--accelerator_config`` file, ``ImportError`` when a flag needs a package that is not installed)."""


def dataclasses_from_namespace(namespace: argparse.Namespace, *dataclass_types: type) -> list[Any]:
    """Instantiate each dataclass from the parsed flags that belong to it (as
    ``parse_args_into_dataclasses``).

    Raises ``FlagError`` for a bad value: a non-finite float (argparse's ``float`` accepts ``nan`` and
    ``inf``), or an error of the dataclass's own validation, attributed to the flag it is about
    (``culprit_field``). An error that cannot be attributed to any flag is re-raised as it is.
    """
    values = vars(namespace)
    result = []
    for dtype in dataclass_types:
        keys = {f.name for f in dataclasses.fields(dtype) if f.init}
        kwargs = {k: v for k, v in values.items() if k in keys}
        for name, value in kwargs.items():
            check_finite(name, value)
        try:
            result.append(dtype(**kwargs))
        except FlagError:
            raise
        except DATACLASS_ERRORS as error:
            flag = culprit_field(dtype, kwargs, str(error))
            if flag is None:
                raise
            message = str(error) if flag in str(error) else f"{type(error).__name__}: {error}"
            raise FlagError(flag, message) from error
    return result


def run_dataclass_command(command: str, namespace: argparse.Namespace, dtype: type,
                          action: Callable[[Any], Any], report: Callable[[Any, Any], str]) -> int:
    """The ``run`` of a subcommand whose flags are the one dataclass ``dtype``: ``result = action(args)``,
    then ``report(args, result)`` printed, and 0; a ``FlagError`` (a bad value, while parsing or in
    ``action``) gives one error line naming its flag and 2 (``fail_flag``)."""
    try:
        (args,) = dataclasses_from_namespace(namespace, dtype)
        result = action(args)
    except FlagError as error:
        return fail_flag(command, error)
    print(report(args, result))
    return 0


def _field_defaults(dtype: type) -> dict[str, Any]:
    """``{field: default}`` of the init fields of ``dtype`` that have a default."""
    defaults = {}
    for f in dataclasses.fields(dtype):
        if f.init and f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.init and f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return defaults


def names_in_message(message: str, names: Sequence[str]) -> list[str]:
    """The ``names`` that occur as whole words in ``message``, in the order they first occur."""
    found = {}
    for name in names:
        match = re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", message)
        if match:
            found[name] = match.start()
    return sorted(found, key=found.get)


def culprit_field(dtype: type, kwargs: dict[str, Any], message: str) -> str | None:
    """The field an error of ``dtype(**kwargs)`` with ``message`` is about, or ``None`` when none is found.

    In order: a field set to a non-default value that the message names; any field the message names; a
    non-default field that fails on its own (the others at their defaults) — provided that the defaults
    alone do not fail (an error without any flag, a broken install say, is no flag's fault).
    """
    defaults = _field_defaults(dtype)
    changed = [name for name, value in kwargs.items() if name not in defaults or value != defaults[name]]
    for candidates in (changed, list(kwargs)):
        named = names_in_message(message, candidates)
        if named:
            return named[0]
    required = {name: value for name, value in kwargs.items() if name not in defaults}
    try:
        dtype(**required)
    except DATACLASS_ERRORS:
        return None
    for name in changed:
        if name in required:
            continue
        try:
            dtype(**required, **{name: kwargs[name]})
        except DATACLASS_ERRORS:
            return name
    return None


# ---------------------------------------------------------------- shared checks
def check_finite(flag: str, value: Any) -> None:
    """``FlagError`` for a float ``nan``/``inf`` (also inside a list)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    for item in items:
        if isinstance(item, float) and not math.isfinite(item):
            raise FlagError(flag, f"{flag} must be a finite number, got {value!r}.")


def check_int(flag: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> None:
    """``FlagError`` unless ``value`` is an int (not a bool) in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FlagError(flag, f"{flag} must be an integer, got {value!r}.")
    if minimum is not None and value < minimum:
        raise FlagError(flag, f"{flag} must be >= {minimum}, got {value}.")
    if maximum is not None and value > maximum:
        raise FlagError(flag, f"{flag} must be <= {maximum}, got {value}.")


FIELD_TYPES: dict[str, tuple[type, ...]] = {"bool": (bool,), "int": (int,), "float": (int, float),
                                            "str": (str,)}
"""The annotations ``check_field_types`` checks (each also with ``| None``) and the types a value may
have."""


def field_kinds(cls: type) -> dict[str, tuple[str, bool]]:
    """``{field: (kind, optional)}`` for the fields of the dataclass ``cls`` that ``check_field_types``
    checks: annotated ``bool``, ``int``, ``float``, ``str`` or ``list[str]``, each optionally ``| None``
    (``"bool | None"`` → ``("bool", True)``). Read from the class's annotations (``typing.get_type_hints``),
    not from ``dataclasses.fields``: ``HfArgumentParser`` rewrites a field's ``type`` in place
    (``dict | str | None`` becomes ``str``)."""
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):
        return {}
    kinds = {}
    for item in dataclasses.fields(cls):
        hint = hints.get(item.name)
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        members = [m for m in (typing.get_args(hint) if union else (hint,)) if m is not type(None)]
        if len(members) != 1 or not item.init:
            continue
        member = members[0]
        optional = union and len(typing.get_args(hint)) > 1
        if member in (bool, int, float, str):
            kinds[item.name] = (member.__name__, optional)
        elif typing.get_origin(member) is list and typing.get_args(member) == (str,):
            kinds[item.name] = ("list[str]", optional)
    return kinds


def _type_problem(kind: str, value: Any) -> str | None:
    """What is wrong with ``value`` for a field of ``kind`` (``"must be True or False"``), ``None`` if
    nothing."""
    if kind == "list[str]":
        ok = isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value)
        return None if ok else "must be a list of strings"
    if isinstance(value, FIELD_TYPES[kind]) and (kind == "bool" or not isinstance(value, bool)):
        return None
    return {"bool": "must be True or False", "int": "must be an integer", "float": "must be a number",
            "str": "must be a string"}[kind]


def check_field_types(arguments: Any) -> None:
    """``FlagError`` naming the first field of the dataclass ``arguments`` whose value does not have its
    annotated type (``field_kinds``: ``bool``, ``int``, ``float``, ``str`` or ``list[str]``, each optionally
    ``| None``; others are left to their own checks). Called first by the commands' ``__post_init__``, so
    that a Python caller's ``overwrite_output_dir="False"`` (a string, which is true) never clears a folder
    and ``output_dir=None`` is named. A path (``os.PathLike``) given for a ``str`` field becomes its string,
    and a tuple or list of strings and paths for a ``list[str]`` field a list of strings;
    ``None`` in a field not annotated ``| None`` is accepted only when that is its default."""
    import os

    defaults = {item.name: item.default for item in dataclasses.fields(arguments)}
    for name, (kind, optional) in field_kinds(type(arguments)).items():
        value = getattr(arguments, name)
        if value is None:
            if optional or defaults[name] is None:
                continue
            raise FlagError(name, f"{name} is required, got None.")
        if kind == "str" and isinstance(value, os.PathLike):
            setattr(arguments, name, os.fspath(value))
            continue
        if kind == "list[str]" and isinstance(value, (list, tuple)):
            value = [os.fspath(item) if isinstance(item, os.PathLike) else item for item in value]
            setattr(arguments, name, value)
        if (problem := _type_problem(kind, value)) is not None:
            raise FlagError(name, f"{name} {problem}, got {value!r}.")


def check_positive(flag: str, value: Any) -> None:
    """``FlagError`` unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FlagError(flag, f"{flag} must be a positive integer, got {value!r}.")


def check_number(flag: str, value: Any, low: float, high: float | None = None, *, open_low: bool = False,
                 open_high: bool = False) -> None:
    """``FlagError`` unless ``value`` is a finite number in the interval from ``low`` to ``high`` (closed
    unless ``open_low`` / ``open_high``; no upper bound when ``high`` is None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FlagError(flag, f"{flag} must be a finite number, got {value!r}.")
    too_low = value <= low if open_low else value < low
    too_high = high is not None and (value >= high if open_high else value > high)
    if too_low or too_high:
        left = "(" if open_low else "["
        right = ")" if open_high or high is None else "]"
        raise FlagError(flag, f"{flag} must be in {left}{low}, {'∞' if high is None else high}{right}, got "
                              f"{value}.")


def check_seed(flag: str, value: Any) -> None:
    """``FlagError`` unless ``value`` is a seed every RNG accepts: an integer in [0, 2**32 - 1]."""
    check_int(flag, value, 0, MAX_SEED)


def check_choice(flag: str, value: Any, allowed: Sequence[Any]) -> None:
    """``FlagError`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise FlagError(flag, f"{flag} must be one of {tuple(allowed)}, got {value!r}.")


def check_percentage(flag: str, value: Any) -> None:
    """``FlagError`` unless ``value`` is an integer percentage strictly between 0 and 100."""
    check_int(flag, value)
    if not 0 < value < 100:
        raise FlagError(flag, f"{flag} must be in (0, 100), got {value}.")


def _check_parents(flag: str, path: Path) -> None:
    """``FlagError`` when the nearest existing folder of ``path`` (``path`` itself, an existing folder, or a
    parent) is a file, or no file can be created in it (``/proc``, a read-only mount, another user's folder):
    found before a command runs, not when it writes its results after minutes or hours of work. The check
    creates a probe file there and removes it at once."""
    import os
    import tempfile

    for folder in ([path] if path.is_dir() else []) + list(path.parents):
        if folder.exists():
            if not folder.is_dir():
                raise FlagError(flag, f"{flag} {str(path)!r} is inside the file {str(folder)!r}.")
            try:
                handle, name = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
            except OSError as error:
                raise FlagError(flag, f"{flag}: {str(path)!r} cannot be written: no file can be created in "
                                      f"{str(folder)!r} ({error.strerror or error}).") from error
            os.close(handle)
            os.unlink(name)
            return


def check_output_dir(flag: str, path: str | Path) -> None:
    """``FlagError`` unless ``path`` can be a folder: not an existing file, no existing file among its
    parents."""
    if str(path).strip() == "":  # before Path(): Path("") is "."
        raise FlagError(flag, f"{flag} must be a folder path, got {str(path)!r}.")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FlagError(flag, f"{flag} {str(path)!r} is a file, not a folder.")
    _check_parents(flag, path)


def check_clearable(folder: Path, inputs: Mapping[str, str | None],
                    flag: str = "overwrite_output_dir") -> None:
    """``FlagError`` naming ``flag`` (the flag that asked for the clearing) when clearing ``folder`` would
    delete the working directory, the home folder, the filesystem root, or one of the run's ``inputs``
    (flag → path)."""
    resolved = folder.resolve()
    if (resolved == Path(resolved.anchor) or Path.home().resolve().is_relative_to(resolved)
            or Path.cwd().resolve().is_relative_to(resolved)):
        raise FlagError(flag, f"--{flag} would clear {str(folder)!r}, which holds the working directory or "
                              "the home folder (or is the root); choose a dedicated --output_dir.")
    for name, path in inputs.items():
        if path and Path(path).resolve().is_relative_to(resolved):
            raise FlagError(flag, f"--{flag} would clear {str(folder)!r}, which holds --{name} {path!r}; "
                                  "choose another --output_dir.")


def staging_folder(output: Path) -> Path:
    """A new hidden folder beside ``output`` to assemble it in, then rename (``tempfile.mkdtemp``; its private
    0o700 is widened by ``share_like_the_user``)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))


def plain_mode(folder: bool = False) -> int:
    """The mode a plain ``open`` (``folder``: ``mkdir``) gives a new file here: 0o666 (0o777) less the
    umask. The umask is read from ``/proc/self/status`` where Linux has it; elsewhere it is set and set back
    (which changes it for every thread for a moment)."""
    import os

    try:
        status = Path("/proc/self/status").read_text()
        mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), 8)
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
    return (0o777 if folder else 0o666) & ~mask


def replace_folder(staging: Path, output: Path) -> None:
    """Put the finished folder ``staging`` at ``output`` (beside it, on one file system), replacing what is
    there without a moment in which both are lost: the old folder is renamed aside (``.<name>.old-*``), the
    new one renamed into place, then the old one deleted. A process killed in between leaves the old folder
    aside, whole; a failed rename puts it back."""
    import os
    import shutil
    import tempfile

    if not output.exists():
        os.replace(staging, output)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
    try:
        os.replace(output, aside / output.name)
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise
    try:
        os.replace(staging, output)
    except BaseException:
        os.replace(aside / output.name, output)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def share_like_the_user(folder: Path) -> None:
    """Give ``folder`` and everything in it the modes a plain ``mkdir`` and ``open`` would (``plain_mode``):
    ``mkdtemp`` makes folders 0o700 and safetensors writes 0o600, which would keep an exported model from
    another user or a serving container."""
    modes = {True: plain_mode(folder=True), False: plain_mode()}
    for path in (folder, *folder.rglob("*")):
        if not path.is_symlink():
            path.chmod(modes[path.is_dir()])


def _written_mode(path: Path) -> int:
    """The mode a rewrite of ``path`` gets: the existing file's (a mode you chose stays), else a plain
    ``open``'s (``mkstemp``'s 0o600 would hide the file from other users)."""
    return path.stat().st_mode & 0o7777 if path.exists() else plain_mode()


def _write_atomically(path: str | Path, write: Callable[[str], None], suffix: str = ".tmp") -> Path:
    """Call ``write(name)`` on a fresh staging file beside ``path`` (``suffix``: its extension), give it
    ``_written_mode`` and rename it over ``path``: a reader sees the old file or the new one, never half of
    it. A symbolic link is followed (its target is rewritten). Returns the path written."""
    import os
    import tempfile

    path = Path(path)
    path = path.resolve() if path.is_symlink() else path
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(handle)
    try:
        write(name)
        os.chmod(name, _written_mode(path))
        os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (``_write_atomically``)."""
    _write_atomically(path, lambda name: Path(name).write_text(text, encoding="utf-8"))


def save_figure(fig: Any, path: str | Path) -> Path:
    """Save the matplotlib figure ``fig`` to ``path`` as a PNG atomically (several workers may write one plot
    at once) and close it; returns the path written."""
    import matplotlib.pyplot as plt

    try:
        return _write_atomically(path, lambda name: fig.savefig(name, dpi=110), suffix=".tmp.png")
    finally:
        plt.close(fig)


def check_result_files(flag: str, files: Mapping[str, Path], *, ours: Callable[[Path], bool], tool: str,
                       inputs: Mapping[str, Sequence[str | Path]] | None = None) -> None:
    """``FlagError`` naming ``flag`` unless the files a command writes for it can be written without losing
    anything: ``files`` maps each file's role to its path, the first being the one that says whose files
    these are (a results file) and the rest named after it (a report, plots). Each must be writable as a file
    (``check_output_file``), none may be another (``--output a.json --json a.json``), none may be or lie in
    one of ``inputs`` (flag → paths: a model folder, the text it reads), and existing ones may be replaced
    only when the first is there and ``ours`` says ``tool`` wrote it: the rerun of a run. So a user's
    ``README.md``, ``notes.json`` or ``config.json`` is never overwritten."""
    roles = list(files)
    for role in roles:
        check_output_file(flag, files[role])
    resolved = {role: files[role].resolve() for role in roles}
    for index, role in enumerate(roles):
        other = next((r for r in roles[:index] if resolved[r] == resolved[role]), None)
        if other is not None:
            raise FlagError(flag, f"{flag}: {str(files[role])!r} would be both the {other} and the {role}; "
                                  "give them different names.")
        for input_flag, paths in (inputs or {}).items():
            for path in paths:
                if resolved[role].is_relative_to(Path(path).resolve()):
                    raise FlagError(flag, f"{flag}: the {role} {str(files[role])!r} would be written over "
                                          f"--{input_flag} {str(path)!r}; choose another --{flag}.")
    first = files[roles[0]]
    owned = first.is_file() and ours(first)
    for role in roles:
        if files[role].exists() and not owned:
            raise FlagError(flag, f"{flag}: {str(files[role])!r} exists and is not from an earlier run of "
                                  f"`{tool}` (its {roles[0]} {str(first)!r} "
                                  f"{'is not one' if first.exists() else 'is not there'}); choose another "
                                  f"--{flag} or move the file away.")


def check_output_file(flag: str, path: str | Path) -> None:
    """``FlagError`` unless ``path`` can be written as a file: not an existing folder, no file among its
    parents."""
    path = Path(path)
    if path.is_dir():
        raise FlagError(flag, f"{flag} {str(path)!r} is a folder, not a file.")
    _check_parents(flag, path)


def _check_existing(flag: str, path: str | Path, what: str, is_kind: Callable[[Path], bool],
                    wrong_kind: str) -> Path:
    """``path`` as a ``Path``; ``FlagError`` when it does not exist (``no such <what>``) or ``is_kind`` is
    false for it (``<path> <wrong_kind>``); an empty string is refused as such (``Path("")`` is ``.``)."""
    if str(path).strip() == "":
        raise FlagError(flag, f"{flag}: an empty path names no {what}.")
    path = Path(path)
    if not path.exists():
        raise FlagError(flag, f"{flag}: no such {what} {str(path)!r}.")
    if not is_kind(path):
        raise FlagError(flag, f"{flag}: {str(path)!r} {wrong_kind}.")
    return path


def check_file(flag: str, path: str | Path) -> Path:
    """``path`` as a ``Path``; ``FlagError`` unless it is an existing file."""
    return _check_existing(flag, path, "file", Path.is_file, "is not a file")


def check_text_file(flag: str, path: str | Path) -> str:
    """The text of the file ``path``; ``FlagError`` naming ``flag`` unless it exists and is UTF-8."""
    try:
        return check_file(flag, path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise FlagError(flag, f"{flag}: {str(path)!r} is not UTF-8 text (byte {error.start}: "
                              f"{error.reason}).") from error


def check_folder(flag: str, path: str | Path, *, what: str = "folder") -> Path:
    """``path`` as a ``Path``; ``FlagError`` unless it is an existing folder (``what``: the folder's kind in
    the message for a missing one, e.g. ``"model folder"``)."""
    return _check_existing(flag, path, what, Path.is_dir, "is a file, not a folder")


def check_model_folder(flag: str, path: str | Path, *, weights: bool = False) -> Path:
    """``path`` as a ``Path``; ``FlagError`` unless it is a local model folder: a folder with ``config.json``
    (not a LoRA adapter) and, with ``weights``, the weights ``from_pretrained`` looks for."""
    from transformers.utils import (
        SAFE_WEIGHTS_INDEX_NAME,
        SAFE_WEIGHTS_NAME,
        WEIGHTS_INDEX_NAME,
        WEIGHTS_NAME,
    )

    folder = check_folder(flag, path, what="model folder")
    if (folder / "adapter_config.json").exists() and not (folder / "config.json").exists():
        raise FlagError(flag,
                        f"{flag}: {str(folder)!r} holds a LoRA adapter, not a full model (finetune with "
                        f"--lora_merge and use {str(folder / 'merged')!r}).")
    if not (folder / "config.json").exists():
        hint = model_folder_hint(folder)
        message = f"{flag}: {str(folder)!r} is not a model folder (it has no config.json){hint}"
        raise FlagError(flag, message if message.endswith("?") else message + ".")
    check_no_remote_code(flag, folder / "config.json")
    check_config_loads(flag, folder)
    names = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
    if weights and not any((folder / name).is_file() for name in names):
        raise FlagError(flag,
                        f"{flag}: {str(folder)!r} holds a config but no weights (none of {list(names)}).")
    if weights:
        for shard in safetensors_files(folder, SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME):
            check_safetensors(flag, shard)
    return folder


def check_config_loads(flag: str, folder: Path) -> None:
    """``FlagError`` naming ``flag`` when ``folder``'s config.json does not load as its model type's config (a
    field of the wrong type or out of range): one sentence, before a tokenizer or model load fails on it with
    a traceback or names the tokenizer."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except (ValueError, TypeError, KeyError) as error:
        raise FlagError(flag, f"{flag}: {str(folder / 'config.json')!r} does not load: "
                              f"{error_reason(error)}") from error


def safetensors_files(folder: Path, single: str, index: str) -> list[Path]:
    """The safetensors files of ``folder``: ``single`` when present, else the shards that ``index`` (a
    ``model.safetensors.index.json``) maps weights to; a missing shard or an unreadable index is left to the
    loader's own error."""
    import json

    if (folder / single).is_file():
        return [folder / single]
    try:
        weight_map = json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values())) if (folder / name).is_file()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def check_safetensors(flag: str, path: Path) -> None:
    """``FlagError`` naming ``flag`` unless ``path``'s safetensors header can be read (a truncated or
    corrupt file); reads the header only."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt"):
            pass
    except (SafetensorError, OSError) as error:
        raise FlagError(flag, f"{flag}: {str(path)!r} is not a readable safetensors file "
                              f"({error_reason(error)}).") from error


def check_no_remote_code(flag: str, config_file: Path) -> None:
    """``FlagError`` naming ``flag`` when ``config_file`` describes a model whose code would come from its
    folder: an ``auto_map`` and a ``model_type`` that neither Transformers nor this package registers.

    The commands never run code from a model folder: they load with ``trust_remote_code=False``, so that
    ``from_pretrained`` neither asks on stdin nor runs it. This check says so in one sentence first. A config
    that is not a JSON object is refused too (the loader's error came later, after the tokenizer's, which
    named the tokenizer).
    """
    import json

    from transformers import CONFIG_MAPPING

    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except OSError:
        return
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise FlagError(flag, f"{flag}: {str(config_file)!r} is not valid JSON ({error}).") from error
    if not isinstance(config, dict):
        raise FlagError(flag, f"{flag}: {str(config_file)!r} holds a JSON {type(config).__name__}, not an "
                              "object of config fields.")
    model_type = config.get("model_type")
    if config.get("auto_map") and model_type not in CONFIG_MAPPING:
        raise FlagError(flag, f"{flag}: {str(config_file.parent)!r} is a model of type {model_type!r} whose "
                              "code comes with the folder (config.json's auto_map); hf-attn-variants runs no "
                              "code from a model folder, so it loads this package's families and "
                              "Transformers' models only.")


def model_folders_below(folder: Path) -> list[Path]:
    """The folders one level below ``folder`` that hold a model (``config.json``), sorted: ``prune`` writes
    ``<output_dir>/model``, ``finetune --lora_merge`` ``<output_dir>/merged``."""
    return sorted(path for path in folder.iterdir() if path.is_dir() and (path / "config.json").is_file())


def model_folder_hint(folder: Path) -> str:
    """What a folder without ``config.json`` points to: ``"; did you mean 'runs/x/model'?"`` when a model is
    one level down, else (an unfinished ``pretrain`` run) its newest checkpoint, which ``export`` takes;
    ``""`` when there is nothing to suggest."""
    below = model_folders_below(folder)
    if below:
        names = " or ".join(repr(str(path)) for path in below[:3])
        return f"; did you mean {names}?"
    steps = sorted((path for path in (folder / "checkpoints").glob("step_*") if path.is_dir()),
                   key=lambda path: int(path.name.removeprefix("step_"))
                   if path.name.removeprefix("step_").isdigit() else -1)
    if steps:
        return (f"; it holds an unfinished pretrain run: export takes its checkpoint {str(steps[-1])!r}, or "
                "rerun the same pretrain command to finish it")
    return ""


def is_hub_id(text: str) -> bool:
    """Whether ``text`` reads as a Hugging Face Hub repository id (``name`` or ``namespace/name``) rather than
    a local path: no such file or folder exists, it does not start like a path (``.``, ``/``, ``~``), its
    namespace is no local folder (``runs/typo`` is a missing local folder, not a Hub id) and
    ``huggingface_hub.utils.validate_repo_id`` accepts it."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not text or Path(text).exists() or text.startswith((".", "/", "~")) or text.count("/") > 1:
        return False
    if "/" in text and Path(text.split("/")[0]).is_dir():
        return False
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def offline_hub_message(flag: str, repo_id: str) -> str:
    """The one sentence for a Hub id that cannot be fetched: offline (``HF_HUB_OFFLINE=1``) or no network, and
    not in the local Hugging Face cache."""
    return (f"{flag}: {repo_id!r} is not a local folder, and as a Hub id it cannot be downloaded: the Hub "
            "cannot be reached (HF_HUB_OFFLINE=1 or no network) and it is not in the local Hugging Face "
            "cache; download it once while online, or pass a local model folder.")


def is_cached_on_hub(repo_id: str, filename: str = "config.json") -> bool:
    """Whether ``filename`` of the Hub repository ``repo_id`` is in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, filename), str)


def check_model_source(flag: str, value: str | Path, *, weights: bool = False) -> str:
    """``value`` when it is a local model folder (``check_model_folder``) or a Hub repository id
    (``from_pretrained`` fetches it); ``FlagError`` naming ``flag`` otherwise. Offline (``HF_HUB_OFFLINE=1``)
    a Hub id that is not in the local cache gets one sentence saying so."""
    from huggingface_hub import is_offline_mode

    text = str(value)
    if not is_hub_id(text):
        return str(check_model_folder(flag, text, weights=weights))
    if is_offline_mode() and not is_cached_on_hub(text):
        raise FlagError(flag, offline_hub_message(flag, text))
    return text


def hub_unreachable(error: BaseException) -> bool:
    """Whether ``error`` (raised by ``from_pretrained``) says the Hub could not be reached and the file was
    not in the local cache (``huggingface_hub.errors.LocalEntryNotFoundError`` anywhere in its chain)."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, LocalEntryNotFoundError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def check_config_source(flag: str, path: str | Path) -> Path:
    """``path`` as a ``Path``; ``FlagError`` unless it is a config (json) file or a folder holding
    ``config.json``."""
    path = Path(path)
    if path.is_file():
        check_no_remote_code(flag, path)
        return path
    if not path.exists():
        raise FlagError(flag, f"{flag}: no such config file or folder {str(path)!r}.")
    return check_model_folder(flag, path)


def check_repo_id(flag: str, repo_id: str) -> None:
    """``FlagError`` unless ``repo_id`` is a valid Hub repository id (``name`` or ``namespace/name``)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise FlagError(flag, f"{flag}: {error_reason(error)}") from error


def argparse_type(check: Callable[[str, Any], None], convert: Callable[[str], Any],
                  flag: str) -> Callable[[str], Any]:
    """An argparse ``type=`` that converts with ``convert`` and validates with ``check(flag, value)``; a bad
    value becomes argparse's one-line ``argument --flag: …`` error."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            expected = {"int": "an integer", "float": "a number"}.get(convert.__name__, convert.__name__)
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}.") from None
        try:
            check(flag, value)
        except FlagError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return value

    parse.__name__ = convert.__name__
    return parse


__all__ = [
    "MAX_SEED",
    "FlagError",
    "add_dataclass_arguments",
    "atomic_write_text",
    "argparse_type",
    "check_choice",
    "check_config_source",
    "check_field_types",
    "check_file",
    "check_finite",
    "check_folder",
    "check_int",
    "check_model_folder",
    "check_model_source",
    "check_number",
    "check_output_dir",
    "check_output_file",
    "check_percentage",
    "check_positive",
    "check_repo_id",
    "check_result_files",
    "check_seed",
    "culprit_field",
    "dataclasses_from_namespace",
    "fail",
    "fail_flag",
    "field_arguments",
    "field_kinds",
    "field_groups",
    "flag_message",
    "hub_unreachable",
    "is_cached_on_hub",
    "is_hub_id",
    "names_in_message",
    "offline_hub_message",
    "plain_mode",
    "quiet_progress",
    "replace_folder",
    "run_dataclass_command",
    "save_figure",
    "with_default_in_help",
]
