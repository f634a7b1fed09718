"""Write trajectories/starts/automation/: the SFT start notebook 03 trains from, stored in float16.

The start is the v1 learning grid's shared ``automation`` start (``benchmarks/learning.py --size small``
at commit 14b590f; the grid is now v2 and has no ``small`` size, so remaking it means checking out
that commit's benchmark):
1,450 SFT steps on the noisy scripted expert (noise 0.3, lr 3e-3, difficulty 3–6) until greedy
success reached 0.44 on 64 held-out tasks — about 40 minutes on 2 cores, too long for a notebook.
Only its policy ships (its critic had a 4-rollout warm-up; runs warm their own). Weights are rounded
to float16 to halve the folder (2.2 MB); they load as float32.

    git worktree add /tmp/v1 14b590f && (cd /tmp/v1 && python benchmarks/learning.py --size small \
        --threads 1 --cells automation)                                          # makes the start
    python trajectories/starts/make_start.py /tmp/v1/runs/learning-small/starts/automation

writes ``automation/policy/`` (a Hugging Face folder) and ``automation/start.json`` (the SFT
record of the source start: steps, success, config hash). Deterministic: the same start gives the
same files.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def write_start(src: Path, out: Path = HERE / "automation") -> list[Path]:
    """Round ``src/model/policy`` to float16 into ``out/policy``; copy ``src/start.json``'s SFT record."""
    from mpo_viz import models

    record = json.loads((src / "start.json").read_text())
    policy, _ = models.load(src / "model")
    policy.model.half()
    if out.exists():
        shutil.rmtree(out)
    models.save(out, policy)
    sft = record["sft"]
    info = {
        "source": "benchmarks/learning.py --size small: the shared automation start (seed 0)",
        "sft_config_hash": record["sft_config_hash"],
        "sft_steps": sft["sft_steps"],
        "sft_success": sft["sft_success"],
        "sft_expert_success": sft["sft_expert_success"],
        "stored_as": "float16",
    }
    (out / "start.json").write_text(json.dumps(info, indent=1) + "\n")
    return sorted(p for p in out.rglob("*") if p.is_file())


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    written = write_start(Path(argv[0]))
    for p in written:
        print(f"{p.relative_to(HERE)}  {p.stat().st_size / 1e3:.0f} kB")
    print(f"total {sum(p.stat().st_size for p in written) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
