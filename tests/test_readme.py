"""What the README says about the files on disk is what the code writes (issue 34 item 5:
it named a table's manifest `manifest.json`, where the book writes `_manifest.json`)."""

import re

import pandas as pd
import pyarrow as pa

from rlprobe_nb.suite import paths
from rlprobe_nb.tables import storage

README = (paths.REPO_ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_names_a_tables_files_as_storage_writes_them(tmp_path):
    folder = storage.write_table(tmp_path / "rollouts", pd.DataFrame({"x": [1]}),
                                 pa.schema([("x", pa.int64())]), {}, key={"table": "rollouts"})
    written = {p.name for p in folder.iterdir()}
    manifests = set(re.findall(r"`([^`\s]*manifest[^`\s]*)`", README))
    assert manifests == {storage.MANIFEST} <= written, (manifests, written)
    working = set(re.findall(r"`(\.[\w-]+\.writing)/`", README))
    assert working == {storage.work_dir(folder).name}, working
