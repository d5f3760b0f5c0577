"""The hidden-state cache: final hidden states of one model over forced sequences, so a
model is forwarded once and every later comparison applies LM heads to cached states.

Files in the cache folder:
  model.json                  the identity the states depend on: the model (weight-file
                              hashes or hub commit, from ``models.model_identity``), dtype,
                              hidden size and tokenizer. A cache is never reused for
                              another identity: ``begin`` refuses, naming the difference.
  head.<sha16>.safetensors    the LM head restricted to the tokenizer's vocabulary
  h-<batch>.<sha16>.safetensors  one batch's states: tensor "hidden" [rows, hidden] and
                              header metadata (rollout ids, row counts, sequence hashes,
                              the batch_tokens it was computed at)
  index.json                  written last by ``finish``: the rollouts covered

Every data file's name carries the first 16 hex digits of its sha256, computed while it
was written; every read checks it, so an altered or damaged file is refused (named), never
turned into rows. A shard holds one batch; a later run reads any rollout from it whatever
its own batching, after checking the sequence's content hash. One writer at a time
(``storage.acquire_lock``).

LM heads stay on the device between calls: a head loaded from a cache, or saved to one,
is kept (its device copy, at most ``HEADS_KEPT`` of them) under its file's path, size,
modification time and inode, so the next run of the engine in this process (the next
checkpoint against the same reference) takes it from there instead of reading and
hashing 1 GB again; a file rewritten since is read again. ``release_heads`` frees them.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Iterable, Sequence

import torch

from rlprobe_nb.forcing.batching import Batch
from rlprobe_nb.forcing.heads import LMHead
from rlprobe_nb.forcing.sequences import ForcedSequence, SequenceSet
from rlprobe_nb.forcing.transfer import host_slices
from rlprobe_nb.tables import keys, storage

UNRECORDED = "unrecorded"
_DATA_RE = re.compile(r"(?P<stem>h-[0-9a-f]+|head)\.(?P<sha>[0-9a-f]{16})\.safetensors\Z")

HEADS_KEPT = 2  # the reference's head and the last checkpoint's: 2 GB of device memory at 8B
_HEADS: OrderedDict = OrderedDict()  # (file, size, mtime_ns, inode, device) -> LMHead
_HEADS_LOCK = threading.Lock()


def _head_key(path: Path, device) -> tuple:
    st = path.stat()
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # "cuda" is the current one: cuda:N
        device = torch.device("cuda", torch.cuda.current_device())
    return (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, str(device))


def _kept_head(key: tuple) -> LMHead | None:
    with _HEADS_LOCK:
        head = _HEADS.get(key)
        if head is not None:
            _HEADS.move_to_end(key)
    return None if head is None else LMHead(head.weight, head.bias, head.softcap,
                                            head.rows_in_model, head.padded_rows_dropped,
                                            padded_mass_max=head.padded_mass_max)


def _keep_head(key: tuple, head: LMHead) -> None:
    with _HEADS_LOCK:
        _HEADS[key] = head
        _HEADS.move_to_end(key)
        while len(_HEADS) > HEADS_KEPT:
            _HEADS.popitem(last=False)


def release_heads() -> None:
    """Free the LM heads kept on the device between runs of the engine."""
    with _HEADS_LOCK:
        _HEADS.clear()


def _head_from(weight, bias, meta: dict) -> LMHead:
    return LMHead(weight, bias, meta.get("softcap"), meta.get("rows_in_model", 0),
                  meta.get("padded_rows_dropped", 0), padded_mass_max=meta.get("padded_mass_max"))


class HiddenCache:
    """Final hidden states of one model over forced sequences, content-addressed by batch."""

    MODEL = "model.json"
    INDEX = "index.json"

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self._index: dict[str, tuple[str, int, int, str]] | None = None
        self._batch_tokens: dict[str, int | str] = {}  # shard stem -> its batch_tokens
        self._release = None

    # identity ----------------------------------------------------------------
    def exists(self) -> bool:
        return (self.folder / self.MODEL).exists()

    def identity(self) -> dict:
        if not self.exists():
            raise FileNotFoundError(
                f"no hidden-state cache at {self.folder}: this model has not been forwarded "
                "over these rollouts yet (run notebook 03 for it, or pass its model)")
        return storage.read_json(self.folder / self.MODEL)

    def begin(self, identity: dict, overwrite: bool = False) -> None:
        """Become the cache's writer for ``identity``: refuse a cache of another identity
        (``overwrite=True`` discards it)."""
        if self._release is None:
            self._release = storage.acquire_lock(self.folder, "(hidden-state cache)")
        try:
            if self.exists() and keys.key_sha(self.identity()) != keys.key_sha(identity):
                if not overwrite:
                    raise storage.StaleTableError(
                        f"{self.folder} caches another model or setting "
                        f"({keys.describe_difference(self.identity(), identity)}); pass "
                        "overwrite=True to discard it")
                for f in self.folder.iterdir():
                    if f.is_file() and f.name != storage.LOCK_FILE:
                        f.unlink()
            for tmp in self.folder.glob(".*.tmp*"):  # litter of a killed writer
                tmp.unlink()
            if not self.exists():
                storage.atomic_write_json(self.folder / self.MODEL, identity)
            self._index = None
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None

    # files ---------------------------------------------------------------------
    def _data_files(self, stem: str) -> list[tuple[Path, str]]:
        out = []
        for p in self.folder.glob(f"{stem}.*.safetensors"):
            m = _DATA_RE.match(p.name)
            if m and m["stem"] == stem:
                out.append((p, m["sha"]))
        return out

    def _write(self, stem: str, tensors: dict, meta: dict, slices=None) -> None:
        for old, _ in self._data_files(stem):
            old.unlink()
        storage.write_tensors(self.folder / f"{stem}.safetensors", tensors, meta,
                              host_slices=slices, content_named=True)

    def _read(self, stem: str, pin_memory: bool = False) -> tuple[dict, dict]:
        found = self._data_files(stem)
        if not found:
            raise FileNotFoundError(f"{self.folder} holds no {stem}: forward the model again")
        (path, sha), = found
        return storage.read_tensors(path, pin_memory=pin_memory, sha256=sha)

    # head ----------------------------------------------------------------------
    def has_head(self) -> bool:
        return bool(self._data_files("head"))

    def save_head(self, head: LMHead) -> None:
        """The sliced LM head (1 GB at 8B; the engine saves it from a background thread).
        A copy stays on its device for the next load (``HEADS_KEPT``)."""
        if self.has_head():
            return
        facts = head.facts()
        weight = head.weight.detach()
        bias = None if head.bias is None else head.bias.detach()
        tensors = {"weight": weight} if bias is None else {"weight": weight, "bias": bias}
        self._write("head", tensors, {k: json.dumps(v) for k, v in facts.items()}, host_slices)
        (path, _), = self._data_files("head")
        # a copy, not the model's own tensor: the model may change or go; the file stays
        _keep_head(_head_key(path, weight.device),
                   _head_from(weight.clone(), None if bias is None else bias.clone(), facts))

    def load_head(self, device) -> LMHead:
        if not self.has_head():
            raise FileNotFoundError(f"{self.folder} holds no LM head; pass the model of this "
                                    "side instead")
        (path, _), = self._data_files("head")
        key = _head_key(path, device)
        kept = _kept_head(key)
        if kept is not None:  # this file, unchanged since this process read or wrote it
            return kept
        tensors, meta = self._read("head")  # pageable: pinning 1 GB once costs more than it saves
        meta = {k: json.loads(v) for k, v in meta.items()}
        head = _head_from(tensors["weight"], tensors.get("bias"), meta).to(device)
        _keep_head(key, head)
        return _kept_head(key)

    # shards ---------------------------------------------------------------------
    @staticmethod
    def shard_stem(members: Sequence[ForcedSequence]) -> str:
        return f"h-{Batch.content_key(members)}"

    def has(self, members: Sequence[ForcedSequence]) -> bool:
        return bool(self._data_files(self.shard_stem(members)))

    def save(self, members: Sequence[ForcedSequence], hidden: torch.Tensor,
             batch_tokens: int) -> None:
        meta = {
            "rollout_ids": json.dumps([s.rollout_id for s in members]),
            "rows": json.dumps([s.n_rows for s in members]),
            "hashes": json.dumps([s.content_hash() for s in members]),
            "batch_tokens": str(int(batch_tokens)),
        }
        self._write(self.shard_stem(members), {"hidden": hidden}, meta)
        self._index = None

    def index(self) -> dict[str, tuple[str, int, int, str]]:
        """rollout id -> (shard stem, first row, rows, sequence hash), from shard headers
        (which also give each shard's batch_tokens)."""
        if self._index is None:
            from safetensors import safe_open
            idx: dict[str, tuple[str, int, int, str]] = {}
            self._batch_tokens = {}
            for path in sorted(self.folder.glob("h-*.safetensors")):
                m = _DATA_RE.match(path.name)
                if not m:
                    continue
                try:
                    with safe_open(str(path), framework="pt", device="cpu") as f:
                        meta = f.metadata() or {}
                    size = meta.get("batch_tokens")  # absent: written before sizes were recorded
                    members = list(zip(json.loads(meta["rollout_ids"]), json.loads(meta["rows"]),
                                       json.loads(meta["hashes"])))
                    size = UNRECORDED if size is None else int(size)
                except Exception as err:  # safetensors' own error type, JSON, a missing key
                    raise storage.DamagedTableError(
                        f"{path}: its header cannot be read ({type(err).__name__}: "
                        f"{str(err)[:100]}): the hidden-state shard is damaged or truncated; "
                        "delete it (it is recomputed on the next run)") from err
                self._batch_tokens[m["stem"]] = size
                start = 0
                for rid, n, hsh in members:
                    idx.setdefault(rid, (m["stem"], start, n, hsh))
                    start += n
            self._index = idx
        return self._index

    def batch_tokens(self, members: Iterable[ForcedSequence]) -> list[int | str]:
        """Every batch_tokens the cached states of ``members`` were computed at, largest
        first (a cache filled by two runs at two sizes holds both), and "unrecorded" for
        shards written before the book recorded them."""
        idx = self.index()
        sizes = {self._batch_tokens[idx[s.rollout_id][0]] for s in members}
        return sorted(sizes - {UNRECORDED}, reverse=True) + sorted(sizes & {UNRECORDED})

    def missing(self, members: Iterable[ForcedSequence]) -> list[str]:
        idx = self.index()
        return [s.rollout_id for s in members
                if s.rollout_id not in idx or idx[s.rollout_id][3] != s.content_hash()]

    def rows(self, members: Sequence[ForcedSequence], pin_memory: bool = False) -> torch.Tensor:
        """Hidden rows of these sequences, concatenated in order (CPU tensor, pinned for a
        non-blocking copy to the GPU if asked). Every shard read is checksum-verified."""
        if self.has(members):  # the common case: the same batch was cached whole
            return self._read(self.shard_stem(members), pin_memory)[0]["hidden"]
        idx = self.index()
        shards: dict[str, torch.Tensor] = {}
        parts = []
        for s in members:
            stem, start, n, hsh = idx[s.rollout_id]
            if hsh != s.content_hash() or n != s.n_rows:
                raise RuntimeError(f"cached hidden states of {s.rollout_id!r} in {self.folder} "
                                   "belong to another forced sequence")
            if stem not in shards:
                shards[stem] = self._read(stem)[0]["hidden"]
            parts.append(shards[stem][start:start + n])
        out = torch.cat(parts)
        return out.pin_memory() if pin_memory else out

    def finish(self, seqs: SequenceSet, facts: dict) -> None:
        idx = self.index()
        storage.atomic_write_json(self.folder / self.INDEX, {
            **facts, "rollouts": len(idx), "shards": len({v[0] for v in idx.values()}),
            "sequences_fingerprint": seqs.fingerprint(), "complete": True})
        self.release()
