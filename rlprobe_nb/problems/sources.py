"""Problem sources -> one table in ``schemas.PROBLEMS``, and the prior project's results.

Sources: MATH-like datasets on the hub (``datasets.load_dataset``), local JSON / JSONL /
parquet files in MATH's schema (``problem, solution, answer?, subject|type, level,
unique_id?``), the demo generator, and the prior project's ``filtered_problems.json``.

Ids are the dataset's ``unique_id``. A hub dataset without one (EleutherAI/hendrycks_math)
gets ``<config>/<split>/<row index>``: stable for a pinned dataset revision, never
Python's ``hash()``. Duplicate ids are an error, as is looking up an unknown id.

The prior project stored one JSON object per model, ``{unique_id: {"response", "correct",
"ground_truth"}}``; its verdicts came from a grader that cut nested braces and evaluated
model text, so imported responses are regraded here and every disagreement is listed.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd

from rlprobe_nb.problems import grading
from rlprobe_nb.suite.prompting import prompt_ids, special_token_texts, text_ids
from rlprobe_nb.tables import schemas

COLUMNS = schemas.PROBLEMS.names


class ProblemsError(ValueError):
    """Bad problem input; the message names the input and the fix."""


# A competition problem is a few hundred characters (MATH's longest: about 4,000). Text
# beyond this is not a problem statement (a pasted file?); refused before tokenizing it.
MAX_PROBLEM_CHARS = 32_000


# --------------------------------------------------------------------------- normalising


def _level(value, where: str) -> int:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return -1  # MATH has a few "Level ?" rows; -1 = unknown, kept visible
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return int(value)
    m = re.search(r"\d+", str(value))
    if m:
        return int(m.group())
    if "?" in str(value):
        return -1
    raise ProblemsError(f"{where}: level {value!r} is not a number or 'Level N'")


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def to_frame(records: list[dict], source: str, default_ids: list[str] | None = None,
             places: list[str] | None = None) -> pd.DataFrame:
    """MATH-schema records -> a PROBLEMS table (gold answers extracted, ids checked).
    ``places``: where each record is, as an error names it (default: its 0-based row)."""
    rows = []
    for i, r in enumerate(records):
        where = places[i] if places is not None else f"{source} row {i}"
        if not isinstance(r, dict):
            raise ProblemsError(f"{where}: expected an object with MATH's fields, got {type(r).__name__}")
        r = {k: (None if _missing(v) else v) for k, v in r.items()}  # parquet/pandas nulls
        if not r.get("problem"):
            raise ProblemsError(f"{where}: missing 'problem' text")
        if len(str(r["problem"])) > MAX_PROBLEM_CHARS:
            raise ProblemsError(f"{where}: its problem text has {len(str(r['problem'])):,} "
                                f"characters, more than a problem statement may have "
                                f"({MAX_PROBLEM_CHARS:,}); fix or drop that row")
        pid = r.get("unique_id") or r.get("problem_id")
        if not pid:
            if default_ids is None:
                raise ProblemsError(f"{where}: missing 'unique_id'; give every problem a stable id")
            pid = default_ids[i]
        try:
            answer = grading.gold_answer(r.get("answer"), r.get("solution"))
        except ValueError as e:
            raise ProblemsError(f"{where} ({pid}): {e}") from None
        rows.append({
            "problem_id": str(pid),
            "problem": str(r["problem"]),
            "solution": str(r.get("solution") or ""),
            "answer": answer,
            "subject": str(r.get("subject") or r.get("type") or ""),
            "level": _level(r.get("level"), where),
            "source": source,
        })
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["level"] = df["level"].astype("int16")
    check_unique(df, source)
    return df


def check_unique(df: pd.DataFrame, what: str) -> None:
    dup = df["problem_id"][df["problem_id"].duplicated()].unique().tolist()
    if dup:
        raise ProblemsError(f"{what}: {len(dup)} duplicate problem ids, e.g. {dup[:3]}; "
                            "ids must be unique (fix the file or drop the duplicates)")


# --------------------------------------------------------------------------- sources


def from_demo(split: str, n: int, seed: int) -> pd.DataFrame:
    from rlprobe_nb.problems.arithmetic import generate_problems

    return to_frame(generate_problems(split, n, seed), f"demo:{split}")


def read_records(path: str | os.PathLike) -> tuple[list[dict], list[str]]:
    """Records of a JSON (a list, or an object keyed by id), JSONL or parquet file, and
    where each is: ``file:line`` (the line it starts on), or for parquet ``file row i``
    (0-based, as pandas shows it)."""
    path = Path(path)
    if not path.exists():
        raise ProblemsError(f"problem file {path} does not exist (problems.path in the suite params)")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        rows = pd.read_parquet(path).to_dict("records")
        return ([{k: _text(v, f"{path} row {i} column {k!r}") for k, v in r.items()}
                 for i, r in enumerate(rows)],
                [f"{path} row {i} (0-based)" for i in range(len(rows))])
    if suffix == ".jsonl":
        records, places = [], []
        for n, line in enumerate(read_text(path).splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line, object_pairs_hook=_unique_pairs(f"{path}:{n}")))
                except json.JSONDecodeError as e:
                    raise ProblemsError(f"{path}:{n}: not valid JSON ({e.msg})") from None
                places.append(f"{path}:{n}")
        return records, places
    if suffix == ".json":
        text = read_text(path)
        data = read_json_strict(path, text)
        if not isinstance(data, (dict, list)):
            raise ProblemsError(f"{path}: expected a list of problems or an object keyed by id")
        places = [f"{path}:{n}" for n in _member_lines(text)]
        if isinstance(data, dict):  # {unique_id: {...}}
            return [{"unique_id": k, **v} if isinstance(v, dict) else v
                    for k, v in data.items()], places
        return data, places
    raise ProblemsError(f"{path}: unsupported file type {suffix!r}; use .json, .jsonl or .parquet")


_SPACE = re.compile(r"[ \t\n\r]*")


def _member_lines(text: str) -> list[int]:
    """The line (1-based) on which each member of a valid JSON text's top-level list or
    object starts (an object's member starts at its key)."""
    decoder = json.JSONDecoder()
    i = _SPACE.match(text).end()
    is_object = text[i] == "{"
    i = _SPACE.match(text, i + 1).end()
    lines, line, counted = [], 1, 0
    while text[i] not in "]}":
        line += text.count("\n", counted, i)
        counted = i
        lines.append(line)
        if is_object:  # the key, then the colon
            i = _SPACE.match(text, decoder.raw_decode(text, i)[1]).end() + 1
            i = _SPACE.match(text, i).end()
        i = _SPACE.match(text, decoder.raw_decode(text, i)[1]).end()
        if text[i] == ",":
            i = _SPACE.match(text, i + 1).end()
    return lines


def _unique_pairs(where: str):
    """A json object_pairs_hook that refuses a repeated key (plain json keeps the last)."""
    def build(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise ProblemsError(f"{where}: key {k!r} appears twice in one object; "
                                    "every id must be unique (fix the file)")
            seen.add(k)
        return dict(pairs)
    return build


def read_text(path: Path) -> str:
    """A text file's content as UTF-8, or a ProblemsError naming the file, the line and
    the column (in characters) of the first byte that is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = len(data[data.rfind(b"\n", 0, e.start) + 1:e.start].decode("utf-8")) + 1
        raise ProblemsError(f"{path}:{line}:{column}: not UTF-8 text (byte "
                            f"{data[e.start]:#04x} at line {line}, column {column}); save the "
                            "file as UTF-8") from None


def read_json_strict(path: Path, text: str | None = None):
    """The JSON value of a file (``text``: its content, if read already), refusing a key
    repeated in one object."""
    try:
        return json.loads(read_text(path) if text is None else text,
                          object_pairs_hook=_unique_pairs(str(path)))
    except json.JSONDecodeError as e:
        raise ProblemsError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def _text(value, where: str):
    """Text stored as bytes (a binary parquet column) decoded as UTF-8, never str(b'..')."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProblemsError(f"{where}: bytes that are not UTF-8 text ({e}); store the "
                                "column as text") from None
    return value


def from_file(path: str | os.PathLike) -> pd.DataFrame:
    records, places = read_records(path)
    return to_frame(records, f"file:{Path(path).name}", places=places)


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = urlparse(endpoint).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def _offline_mode() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def from_hub(hub_id: str, config: str | None, split: str) -> pd.DataFrame:
    """A MATH-like dataset from the hub (or the local datasets cache when offline)."""
    if not hub_id:
        raise ProblemsError("problems.source is 'hub' but problems.hub_id is empty")
    hint = ("use a local copy instead: problems.source: file and problems.path: "
            "<a .json/.jsonl/.parquet file in MATH's schema>")
    # datasets retries an unreachable hub for ~25 s; probe once and fail in seconds.
    if not _offline_mode() and not _hub_reachable():
        raise ProblemsError(
            f"the Hugging Face hub is unreachable, so {hub_id!r} cannot be downloaded; "
            f"if it is in your datasets cache set HF_HUB_OFFLINE=1, otherwise {hint}")
    import datasets

    try:
        ds = datasets.load_dataset(hub_id, config, split=split)
    except (ConnectionError, OSError) as e:
        raise ProblemsError(f"could not load {hub_id!r} (config {config!r}, split {split!r}) "
                            f"from the hub or the local cache: {e}; {hint}") from None
    records = ds.to_list()
    ids = [f"{config or 'default'}/{split}/{i:05d}" for i in range(len(records))]
    return to_frame(records, f"hub:{hub_id}/{config}/{split}", default_ids=ids)


def load_problems(source: str, *, hub_id: str | None = None, config: str | None = None,
                  split: str = "test", path: str | os.PathLike | None = None,
                  n: int | None = None, seed: int = 0, split_name: str = "test",
                  levels: list[int] | None = None, subjects: list[str] | None = None,
                  limit: int | None = None) -> pd.DataFrame:
    """Load from one source, then filter by level/subject and keep the first ``limit``."""
    if source == "demo":
        if n is None:
            raise ProblemsError("problems.source is 'demo' but problems.n is not set")
        df = from_demo(split_name, n, seed)
    elif source == "hub":
        df = from_hub(hub_id, config, split)
    elif source in ("file", "prior"):
        if not path:
            raise ProblemsError(f"problems.source is {source!r} but problems.path is not set")
        df = from_file(path)
    else:
        raise ProblemsError(f"unknown problems.source {source!r}; valid: demo, hub, file, prior")
    return filter_problems(df, levels=levels, subjects=subjects, limit=limit)


def suite_problems(P, n: int | None = None, limit: int | None = None) -> pd.DataFrame:
    """The problems of a suite's ``problems`` section (``n`` and ``limit`` default to its
    own: chapter 09 reads the first ``takeover.n_problems`` of the same source)."""
    from rlprobe_nb.suite import paths

    Q = P.problems
    return load_problems(
        Q.source, hub_id=Q.hub_id, config=Q.config, split=Q.split,
        path=Q.path and paths.resolve(Q.path), n=Q.n if n is None else n, seed=Q.seed,
        split_name=Q.split_name, levels=Q.levels, subjects=Q.subjects,
        limit=Q.limit if limit is None else limit)


def filter_problems(df: pd.DataFrame, levels: list[int] | None = None,
                    subjects: list[str] | None = None, limit: int | None = None) -> pd.DataFrame:
    out = df
    if levels:
        out = out[out["level"].isin([int(x) for x in levels])]
    if subjects:
        known = set(df["subject"])
        unknown = [s for s in subjects if s not in known]
        if unknown:
            raise ProblemsError(f"unknown subjects {unknown}; this source has {sorted(known)}")
        out = out[out["subject"].isin(subjects)]
    out = out.sort_values("problem_id", kind="stable")  # stable id order, as documented
    if limit is not None:
        out = out.head(int(limit))
    if out.empty:
        raise ProblemsError(f"no problems left after filtering (levels={levels}, "
                            f"subjects={subjects}, limit={limit}) out of {len(df)}")
    return out.reset_index(drop=True)


def get_problem(df: pd.DataFrame, problem_id: str) -> pd.Series:
    hit = df[df["problem_id"] == problem_id]
    if hit.empty:
        near = [p for p in df["problem_id"] if problem_id.split("/")[-1] in p][:3]
        raise KeyError(f"problem id {problem_id!r} is not in the problems table "
                       f"({len(df)} problems{'; similar: ' + str(near) if near else ''})")
    return hit.iloc[0]


# --------------------------------------------------------------------------- prior project


def read_prior_responses(path: str | os.PathLike) -> pd.DataFrame:
    """``{unique_id: {"response", "correct", "ground_truth"}}`` -> one row per problem."""
    path = Path(path)
    if not path.exists():
        raise ProblemsError(f"prior responses file {path} does not exist")
    data = read_json_strict(path)
    if not isinstance(data, dict):
        raise ProblemsError(f"{path}: expected an object {{unique_id: {{response, correct, "
                            "ground_truth}}}}")
    rows = []
    for pid, v in data.items():
        if not isinstance(v, dict) or "response" not in v:
            raise ProblemsError(f"{path}: entry {pid!r} has no 'response'")
        rows.append({"problem_id": str(pid), "response": str(v["response"] or ""),
                     "stored_correct": v.get("correct"),
                     "stored_ground_truth": v.get("ground_truth")})
    return pd.DataFrame(rows, columns=["problem_id", "response", "stored_correct",
                                       "stored_ground_truth"])


def regrade_prior(prior: pd.DataFrame, problems: pd.DataFrame, model: str,
                  timeout_s: float = 5.0, workers: int = 2
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Regrade imported responses against our gold answers.

    Returns (answers in schemas.ANSWERS, disagreements): every row whose new verdict
    differs from the stored one, with both gold answers side by side.
    """
    missing = sorted(set(prior["problem_id"]) - set(problems["problem_id"]))
    if missing:
        raise ProblemsError(f"{len(missing)} imported responses of {model!r} name problems "
                            f"missing from the problems table, e.g. {missing[:3]}")
    gold = problems.set_index("problem_id")["answer"]
    golds = [gold[p] for p in prior["problem_id"]]
    grades = grading.grade_many(prior["response"].tolist(), golds, timeout_s, workers)
    answers = pd.DataFrame({
        "model": model, "problem_id": prior["problem_id"].values, "sample": 0,
        "temperature": float("nan"), "seed": None, "response": prior["response"].values,
        "n_tokens": None, "finish_reason": "imported",
        "extracted": [g.extracted for g in grades], "grade_method": [g.method for g in grades],
        "n_boxes": [g.n_boxes for g in grades], "correct": [g.correct for g in grades],
        "failure_type": ["correct" if g.correct else "imported" for g in grades]})
    cmp = prior.assign(gold=golds, extracted=answers["extracted"].values,
                       grade_method=answers["grade_method"].values,
                       correct=answers["correct"].values)
    stored = cmp["stored_correct"].map(lambda x: None if x is None else bool(x))
    disagree = cmp[stored.notna() & (stored != cmp["correct"])]
    disagreements = disagree[["problem_id", "stored_correct", "correct", "stored_ground_truth",
                              "gold", "extracted", "grade_method"]].assign(model=model)
    return answers, disagreements.reset_index(drop=True)


def rollouts_from_text(answers: pd.DataFrame, problems: pd.DataFrame, tokenizer,
                       template: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Imported (text-only) responses as rollouts: prompt ids from the chat template,
    response ids from ``prompting.text_ids`` (tokenized on their own, no special tokens
    added, special-token text kept as text and flagged ``special_token_text``).

    Returns (rollouts, set_aside): rows that cannot be forced (an empty response) are set
    aside with the reason, never altered and never silently dropped."""
    if answers.empty:
        raise ProblemsError("no imported responses to turn into rollouts")
    empty = answers["response"].fillna("").str.strip() == ""
    set_aside = answers.loc[empty, ["model", "problem_id"]].assign(reason="empty response")
    text = problems.set_index("problem_id")["problem"]
    rows = []
    for a in answers[~empty].itertuples(index=False):
        ids = text_ids(tokenizer, a.response)
        flags = "special_token_text" if special_token_texts(tokenizer, a.response) else ""
        rows.append({
            "model": a.model, "problem_id": a.problem_id,
            "rollout_id": f"{a.problem_id}#{int(a.sample)}", "sample": int(a.sample),
            "temperature": float("nan"), "seed": None,
            "prompt_ids": prompt_ids(tokenizer, text[a.problem_id], template),
            "response_ids": ids, "response": a.response,
            "n_tokens": len(ids), "finish_reason": "imported", "token_method": "text",
            "extracted": a.extracted, "grade_method": a.grade_method,
            "n_boxes": int(a.n_boxes), "correct": bool(a.correct),
            "failure_type": "correct" if a.correct else "imported", "flags": flags})
    if not rows:
        raise ProblemsError(f"all {len(answers)} imported responses are empty: nothing to force")
    return (pd.DataFrame(rows, columns=schemas.ROLLOUTS.names),
            set_aside.reset_index(drop=True))
