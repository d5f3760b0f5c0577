"""``params/<name>/`` written from what ``discover`` found: ``suite.yaml`` (the reference as
a model, the last RLVR checkpoint as the target, every other section copied from a suite
named by ``--like``), one ``<run>_step_N.yaml`` per checkpoint, and ``discovered.json``, the
record of what was found (params reads only ``*.yaml``). The folder is built aside and
renamed into place, then loaded with ``params.load`` so a suite that the book would refuse
is refused here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from rlprobe_nb.suite import paths
from rlprobe_nb.suite.param_schema import SECTIONS, ParamsError
from rlprobe_nb.suite.run_layouts import DiscoverError
from rlprobe_nb.tables.atomic import atomic_folder

RECORD = "discovered.json"


def _like_sections(like: str, names: set[str]) -> dict:
    """The sections of suite ``like`` (and its prompt template); pairs that name models
    this suite lacks are dropped."""
    like_file = paths.suite_params_dir(like) / "suite.yaml"
    if not like_file.is_file():
        raise DiscoverError(f"--like {like}: no {like_file}; name a suite of {paths.params_dir()}")
    raw = yaml.safe_load(like_file.read_text()) or {}
    out = {k: raw[k] for k in ("prompt_template", *SECTIONS) if k in raw}
    forcing = dict(out.get("forcing") or {})
    if "pairs" in forcing:
        forcing["pairs"] = [p for p in forcing["pairs"] if set(p) <= names]
        out["forcing"] = forcing
    return out


def write(name: str, entries: list[dict], reference: tuple[str, dict], like: str,
          description: str, record: dict, force: bool) -> Path:
    """Write the suite; ``entries``: {"name", "step", "run", "model", "comment"} each."""
    folder = paths.suite_params_dir(name)
    if folder.exists() and not force:
        raise DiscoverError(f"{folder} exists; pass --force to replace it (or another --name)")
    ref_name, ref_spec = reference
    rlvr = sorted((e for e in entries if e["run"] == "rlvr"), key=lambda e: e["step"])
    if not rlvr:
        raise DiscoverError("no RLVR checkpoint to write; see the plan above")
    suite = {"suite": name, "description": description, "reference": ref_name,
             "target": rlvr[-1]["name"], "models": {ref_name: ref_spec},
             **_like_sections(like, {ref_name} | {e["name"] for e in entries})}
    head = (f"# Written by python -m rlprobe_nb.suite.discover ({RECORD} beside this file says "
            f"what was found).\n# Sections below 'models' are copied from params/{like}.\n")
    existed = folder.exists()
    with atomic_folder(folder) as tmp:
        (tmp / "suite.yaml").write_text(head + yaml.safe_dump(suite, sort_keys=False))
        for e in entries:
            body = {"step": e["step"], "model": e["model"]}
            if e["run"] != "rlvr":
                body["run"] = e["run"]
            (tmp / f"{e['name']}.yaml").write_text(
                f"# {e['comment']}\n" + yaml.safe_dump(body, sort_keys=False))
        (tmp / RECORD).write_text(json.dumps(record, indent=2, default=str) + "\n")
    try:
        validate(name)
    except DiscoverError:
        if not existed:  # leave no suite the book would refuse
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def validate(name: str):
    from rlprobe_nb.suite import params

    try:
        return params.load(name)
    except ParamsError as exc:
        raise DiscoverError(f"the suite written to {paths.suite_params_dir(name)} does not "
                            f"load: {exc}") from exc
