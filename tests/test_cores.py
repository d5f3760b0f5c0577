"""Sharing the cores between notebooks that run at once: the book's lanes write how many
threads each running kernel may use, and a kernel adopts it between shards."""

from __future__ import annotations

from pathlib import Path

import torch

from rlprobe_nb import book_runs, cores


def test_each_running_lane_gets_its_share_of_the_cores_and_the_last_one_all(tmp_path, monkeypatch):
    before = torch.get_num_threads()
    try:
        with cores.Lanes(tmp_path, cores=4) as lanes:
            assert Path(cores.os.environ[cores.CORES_FILE_ENV]) == lanes.path
            lanes.started(), lanes.started()
            assert lanes.path.read_text() == "2" and cores.adopt() == 2 == torch.get_num_threads()
            lanes.ended()
            assert cores.adopt() == 4 == torch.get_num_threads()
        assert not lanes.path.exists() and cores.CORES_FILE_ENV not in cores.os.environ
        assert cores.adopt() is None, "outside the book nothing changes"
    finally:
        torch.set_num_threads(before)


def test_a_lane_stops_at_its_failure_and_the_other_lane_runs_to_its_end(tmp_path):
    ran, shares = [], []
    lanes = cores.Lanes(tmp_path, cores=2)

    def run(nb, parameters, stem):
        shares.append((stem, lanes.share()))
        ran.append(stem)
        if stem == "05":
            raise book_runs.NotebookFailed(nb, "boom", None)
        return 0.0, []

    plan = [(Path(f"{s}.ipynb"), {}, s) for s in ("03", "04", "05", "06", "09")]
    finished, failed = [], []
    status = book_runs.run_waves(plan, [[[0]], [[1, 2, 3], [4]]], run,
                                 lambda i, r: finished.append(i), lambda i, e: failed.append(i),
                                 lambda stem: tmp_path / stem, lanes=lambda: lanes)
    assert status == 1 and failed == [2]
    assert "06" not in ran and {"03", "04", "05", "09"} == set(ran)
    assert sorted(finished) == [0, 1, 4]
    assert dict(shares)["03"] == 2, "a wave of one lane is not shared out"
    assert lanes.running == 0


def test_a_thread_limit_in_the_environment_caps_every_share(tmp_path, monkeypatch):
    """The test session's small book runs with OMP_NUM_THREADS=1 beside other tests: the
    lane left alone must not take a second thread."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with cores.Lanes(tmp_path) as lanes:
        lanes.started()
        assert lanes.share() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert cores.available() >= 1
