"""The tables a chapter computes from the token tables (04's aggregates, 05's spikes and
its checks), under the reuse rule of every table of the book.

A chapter declares its tables, and the settings the rows of each depend on, before any
work (``ChapterTables``). Each table's key is ``lineage.derived_key``: the key hashes of
the token tables (and of any other table it reads, e.g. the placebo run's), the source
files of the chapter's code, and those settings. Then, table by table:

  - complete with its key: reused, read from disk, not computed again;
  - holding another key: refused before any work, naming the difference (a source file
    ``code.files.spikes/statistic.py``, an input table ``inputs.tokens/...``, a setting
    ``settings.seed``), unless ``overwrite``: then recomputed;
  - missing (a first run, or a run killed before it wrote the table): computed.

The chapter says which in one line (``reusing ...`` when nothing changed).
``ChapterTables.get`` returns a table as read back from disk, so a chapter shows the same
frames whether it computed them in this run or reused them.
"""

from __future__ import annotations

from typing import Any, Callable

import pandas as pd

from rlprobe_nb.suite import params, paths
from rlprobe_nb.tables import keys, lineage, schemas, storage


class ChapterTables:
    """The tables of one chapter, each computed or reused (see the module docstring).

    settings: table name -> the chapter's settings its rows depend on (its notebook
    parameters); inputs: the key hashes of tables it reads besides the suite's token
    tables (``lineage.token_shas(P, pairs)``); manifest: what every table's manifest
    records (``provenance.manifest``); producer: the notebook that writes them."""

    def __init__(self, P: params.Params, producer: str, settings: dict[str, dict],
                 manifest: dict, inputs: dict[str, str] | None = None,
                 overwrite: bool = False):
        self.producer = producer
        self.manifest = {**manifest, "producer": producer}
        self.keys = {name: lineage.derived_key(P, name, s, inputs) for name, s in settings.items()}
        self.folders = {name: lineage.folder(P, name) for name in settings}
        held = {name: storage.read_manifest(folder).get("key")
                for name, folder in self.folders.items() if storage.is_complete(folder)}
        stale = [name for name, key in held.items()
                 if keys.key_sha(key) != keys.key_sha(self.keys[name])]
        if stale and not overwrite:
            raise storage.StaleTableError(
                f"{producer}: {self._which(stale)} under {paths.data_dir(P.suite)} were "
                f"computed from other inputs than the current ones "
                f"({keys.describe_difference(held[stale[0]], self.keys[stale[0]])}); rerun "
                f"{producer} with -p overwrite True (python -m rlprobe_nb.book --overwrite) "
                "to recompute them, or restore the inputs")
        self.reused = {name for name in held if name not in stale}
        for name in self.reused:
            storage.verify(self.folders[name])
        print(self._plan(stale, held))

    def _which(self, names: list[str]) -> str:
        if len(names) == len(self.keys):
            return f"its {len(names)} tables"
        return f"{len(names)} of its {len(self.keys)} tables ({', '.join(names)})"

    def _plan(self, stale: list[str], held: dict) -> str:
        """The one line that says what this run does with the chapter's tables."""
        todo = [name for name in self.keys if name not in self.reused]
        if not todo:
            return (f"reusing the {len(self.keys)} tables of {self.producer}: complete, same "
                    f"inputs ({', '.join(self.keys)})")
        missing = [name for name in todo if name not in stale]
        said = ([f"recomputing {self._which(stale)}: computed from other inputs "
                 f"({keys.describe_difference(held[stale[0]], self.keys[stale[0]])})"]
                if stale else [])
        said += [f"computing {self._which(missing)}"] if missing else []
        said += [f"reusing the other {len(self.reused)}, complete with the same inputs"
                 ] if self.reused else []
        return "; ".join(said)

    def get(self, name: str | tuple[str, ...], compute: Callable[..., Any], *args,
            **kwargs) -> pd.DataFrame | tuple[pd.DataFrame, ...]:
        """The table ``name`` (or the tables of a tuple of names, which ``compute`` returns
        together, in that order): read back from disk after ``compute(*args, **kwargs)``
        wrote it, or as reused."""
        names = (name,) if isinstance(name, str) else tuple(name)
        undeclared = [n for n in names if n not in self.keys]
        if undeclared:
            raise KeyError(f"{self.producer} did not declare the tables {undeclared}")
        if not set(names) <= self.reused:
            frames = compute(*args, **kwargs)
            for n, frame in zip(names, (frames,) if isinstance(name, str) else frames):
                storage.write_table(self.folders[n], frame, schemas.TABLES[n], self.manifest,
                                    key=self.keys[n])
        read = tuple(storage.read_table(self.folders[n]) for n in names)
        return read[0] if isinstance(name, str) else read
