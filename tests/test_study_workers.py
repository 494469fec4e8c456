"""``scripts/study_workers.sh``'s ``run_workers``: with several workers, the study scripts' runs see an output
folder that they accept (the workers' logs are hidden names, which the folder check does not count)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hf_attn_variants.training.outputs import foreign_files_in


ROOT = Path(__file__).resolve().parents[1]


def test_workers_leave_no_file_a_run_would_refuse(tmp_path: Path) -> None:
    """Two background workers, the caller, then its final pass all run; $OUT (created if missing) then
    holds only the workers' logs, named so that lengthgen's folder check (``foreign_files_in``) does not
    count them."""
    out = tmp_path / "study"
    probe = "import os; print(sorted(os.listdir(os.environ['OUT'])))"
    script = f'source scripts/study_workers.sh; run_workers "{sys.executable}" -c "{probe}"'
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OUT": str(out), "WORKERS": "3", "PY": sys.executable})
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2, done.stdout  # the caller and its final pass
    logs = sorted(path.name for path in out.iterdir())
    assert logs == [".worker_2.log", ".worker_3.log"], logs
    assert foreign_files_in(out) == []
