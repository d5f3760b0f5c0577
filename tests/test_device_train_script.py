"""scripts/device_train_demo.sh brings adapters back as they are saved (issue 44): each
`collect` (and each `wait`) packs every adapter saved since the last one, and a GRPO
stage's state when it changed, so a run outlives the GPU machine's 30-minute hold."""

import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device_train_demo.sh"


def collect(run: Path, out: Path) -> list[str]:
    before = set(out.iterdir())
    subprocess.run(["bash", str(SCRIPT), "collect"], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "RLPROBE_TRAIN_RUN": str(run), "OUT": str(out)})
    new = sorted(set(out.iterdir()) - before)
    names = []
    for part in new:
        with tarfile.open(part) as tar:
            names += [m.name for m in tar.getmembers() if m.isfile()]
    return sorted(names)


def saved(run: Path, rel: str, text: str = "w") -> None:
    (run / rel).parent.mkdir(parents=True, exist_ok=True)
    (run / rel).write_text(text)


def test_each_adapter_comes_back_once_and_a_state_each_time_it_changes(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    saved(run, "sft/adapters/dpo/adapter_model.safetensors")
    saved(run, "rlvr/adapters/rlvr_step_100/adapter_model.safetensors")
    saved(run, "rlvr/adapters/.rlvr_step_200.tmp/adapter_model.safetensors")  # being written
    saved(run, "rlvr/state/progress.json", '{"step": 100}')
    saved(run, "rlvr/train_log.csv")
    assert collect(run, out) == ["rlvr/adapters/rlvr_step_100/adapter_model.safetensors",
                                 "rlvr/state/progress.json", "rlvr/train_log.csv",
                                 "sft/adapters/dpo/adapter_model.safetensors"]
    assert collect(run, out) == []  # nothing new
    saved(run, "rlvr/adapters/rlvr_step_200/adapter_model.safetensors")
    saved(run, "rlvr/state/progress.json", '{"step": 200}')
    assert collect(run, out) == ["rlvr/adapters/rlvr_step_200/adapter_model.safetensors",
                                 "rlvr/state/progress.json", "rlvr/train_log.csv"]
