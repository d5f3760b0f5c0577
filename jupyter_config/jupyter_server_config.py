"""JupyterLab settings for this checkout. `make lab` puts this folder on
JUPYTER_CONFIG_PATH, so they add to your own (~/.jupyter still wins where both set an
option) and apply only to JupyterLab started that way.

- lab/settings/overrides.json changes JupyterLab's defaults (your own settings still
  win): a `.py` file opens in jupytext's "Jupytext Notebook" viewer, so a chapter
  `notebooks/NN_*.py` opens as the notebook it is (right-click > Open With > Editor for
  the text).
- Saving a chapter writes both twins (jupytext.toml pairs them); the `.ipynb` twin under
  notebooks/ is written without outputs, as the repository keeps it. Executed notebooks
  elsewhere (figures/, papermill outputs) keep theirs.
"""

import warnings
from pathlib import Path, PurePosixPath

c = get_config()  # noqa: F821 (traitlets defines it while loading this file)

c.LabApp.app_settings_dir = str(Path(__file__).resolve().parent / "lab" / "settings")


def strip_outputs_of_chapter_twins(model, path, contents_manager, **kwargs):
    """Pre-save hook: a notebook saved under a `notebooks/` folder loses its outputs."""
    if model.get("type") != "notebook" or not path.endswith(".ipynb"):
        return
    if PurePosixPath(path).parent.name != "notebooks":
        return
    nb = model["content"]
    nb["metadata"].pop("widgets", None)  # saved widget state is output too
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None


c.FileContentsManager.pre_save_hook = strip_outputs_of_chapter_twins
# The server applies this config to its contents manager more than once (jupytext swaps
# in its own); each time jupyter_server warns that the hook replaces... the same hook.
warnings.filterwarnings("ignore", message=r"Overriding existing pre_save_hook \(strip_outputs_of_chapter_twins\)")
