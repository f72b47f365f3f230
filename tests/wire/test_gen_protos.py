"""Generated code in tandem/v1 matches protos/ (deploy/gen_protos.sh --check),
and --check really fails, naming the file, when a proto changes."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "deploy/gen_protos.sh"


def run_check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / SCRIPT), "--check"], cwd=root, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHON": sys.executable})


def test_generated_code_is_up_to_date():
    r = run_check(ROOT)
    assert r.returncode == 0, f"run {SCRIPT} and commit the result:\n{r.stdout}{r.stderr}"


def test_check_names_differing_and_stale_files(tmp_path):
    for d in ("deploy", "protos", "tandem/v1"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__", "configs"))
    reward = tmp_path / "protos/tandem/v1/reward.proto"
    reward.write_text(reward.read_text().replace("repeated double scores = 1;", "repeated float scores = 1;"))
    (tmp_path / "tandem/v1/old_pb2.py").write_text("# left over\n")
    r = run_check(tmp_path)
    assert r.returncode == 1
    assert "tandem/v1/reward_pb2.py (differs)" in r.stderr
    assert "tandem/v1/old_pb2.py (stale" in r.stderr
    assert "data_pb2.py" not in r.stderr
