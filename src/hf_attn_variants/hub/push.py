"""``hf-attn-variants push``: upload an exported folder to the Hugging Face Hub.

The folder is uploaded as it is (``HfApi.create_repo``, ``create_branch`` for a ``--revision``, then
``upload_folder``); nothing in it is modified.
The token comes from the usual places (``--token``, ``HF_TOKEN``, ``hf auth login``'s stored token), as
``huggingface_hub.get_token`` finds it. Without a network, with ``HF_HUB_OFFLINE=1``, without a token or
on any Hub error the command prints ONE sentence saying why nothing was uploaded and exits with status 1.
A bad flag value (a ``--folder`` that is not an export, a malformed ``--repo_id``, an empty
``--commit_message``) is found before anything is contacted: one error line naming the flag, status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..cli_utils import FlagError, check_field_types, check_folder, check_repo_id, error_reason


class PushError(RuntimeError):
    """A push that did not happen; the message is one sentence for the user."""


@dataclass
class PushArguments:
    """Arguments of ``push`` (each is also a ``--flag``)."""

    folder: str = field(metadata={"help": "An exported folder (hf-attn-variants export)."})
    repo_id: str = field(metadata={"help": "Target repository, e.g. user/name."})
    private: bool = field(default=False, metadata={"help": "Create the repository as private."})
    token: str | None = field(default=None,
                              metadata={"help": "Hub token (default: HF_TOKEN or the stored login)."})
    commit_message: str = field(default="Upload model exported with hf_attn_variants",
                                metadata={"help": "Commit message."})
    revision: str | None = field(default=None,
                                 metadata={"help": "Branch to push to, created from main if it does "
                                                   "not exist (default: main)."})

    def __post_init__(self) -> None:
        """Check the values that need no file; a bad one raises ``FlagError`` (a ``ValueError``) naming it."""
        check_field_types(self)
        check_repo_id("repo_id", self.repo_id)
        if not self.commit_message.strip():
            raise FlagError("commit_message", "commit_message must not be empty.")
        if self.revision is not None and not self.revision.strip():
            raise FlagError("revision", "revision must be a branch name, got an empty string.")


def _offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    from huggingface_hub import constants

    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def check_folder_is_export(folder: str) -> Path:
    """``folder`` as a ``Path``; ``FlagError`` naming ``folder`` unless it is a complete export."""
    from .export import check_export

    path = check_folder("folder", folder, what="export folder")
    try:
        check_export(path)
    except ValueError as error:
        reason = str(error) if str(error).endswith(".") else f"{error}."
        raise FlagError("folder", f"folder: {reason} Run `hf-attn-variants export` first.") from error
    return path


def push(args: PushArguments) -> str:
    """Upload ``args.folder`` to ``args.repo_id``; returns the commit URL. Raises ``FlagError`` for a folder
    that is not an export, ``PushError`` (one sentence) when the Hub cannot be used."""
    from huggingface_hub import HfApi, get_token

    if args.token is not None and not args.token.strip():  # or the stored login would be used in its place
        raise FlagError("token", "token: an empty --token; leave it out to use HF_TOKEN or the stored login.")
    folder = check_folder_is_export(args.folder)
    if _offline():
        raise PushError(
            "Nothing was pushed: HF_HUB_OFFLINE is set, so the Hub cannot be reached; the export in "
            f"{folder} is unchanged."
        )
    token = args.token or get_token()
    if not token:
        raise PushError(
            "Nothing was pushed: no Hugging Face token was found (pass --token, set HF_TOKEN or run `hf auth "
            "login`)."
        )
    api = HfApi(token=token)
    step = "could not be reached or refused to create the repository"
    try:
        api.create_repo(args.repo_id, private=args.private, exist_ok=True, repo_type="model")
        # upload_folder commits to an existing branch only; a pull request's ref (refs/pr/N) is no branch name
        if args.revision is not None and not args.revision.startswith("refs/"):
            step = "refused to create the branch"
            api.create_branch(args.repo_id, branch=args.revision, repo_type="model", exist_ok=True)
        step = "refused the upload"
        info = api.upload_folder(folder_path=str(folder), repo_id=args.repo_id, repo_type="model",
                                 commit_message=args.commit_message, revision=args.revision)
    except Exception as error:  # noqa: BLE001 - network, auth, offline, Hub errors: one sentence, no traceback
        reason = error_reason(error, 200)
        raise PushError(
            f"Nothing was uploaded to {args.repo_id}: the Hub {step} ({type(error).__name__}: {reason}); the "
            f"export in {folder} is unchanged."
        ) from None
    return str(getattr(info, "commit_url", info))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags: one per ``PushArguments`` field."""
    from ..cli_utils import add_dataclass_arguments

    add_dataclass_arguments(parser, PushArguments)


def run(namespace: argparse.Namespace) -> int:
    """CLI entry: push; a bad flag value gives one error line naming it and returns 2, a push the Hub did
    not take prints one sentence and returns 1."""
    from ..cli_utils import dataclasses_from_namespace, fail_flag

    try:
        (args,) = dataclasses_from_namespace(namespace, PushArguments)
        url = push(args)
    except FlagError as error:
        return fail_flag("push", error)
    except PushError as error:
        print(f"hf-attn-variants push: {error}", file=sys.stderr)
        return 1
    print(f"Pushed {args.folder} to {url}")
    return 0


__all__ = ["PushArguments", "PushError", "add_arguments", "check_folder_is_export", "push", "run"]
