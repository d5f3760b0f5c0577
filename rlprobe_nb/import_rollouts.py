"""A trainer's rollout dump -> the book's rollouts table (``schemas.ROLLOUTS``), graded by
the book's grader, plus the problems it holds as a MATH-schema JSONL file.

    python -m rlprobe_nb.import_rollouts DUMP --suite NAME [--format auto|verl|trl|
        open-instruct] [--problems FILE] [--model NAME] [--temperature T] [--out DIR]

Formats (README "Bring your own run"):
  verl            ``{step}.jsonl`` (trainer.rollout_data_dir): ``input`` (the prompt decoded
                  without special tokens), ``output``, ``gts``; text only
  trl             ``completions/completions_NNNNN.parquet``: ``prompt`` and ``completion``,
                  strings or chat messages; text only, no ground truth (give --problems)
  open-instruct   traces JSONL: ``prompt_tokens``, ``response_tokens``, ``finish_reason``,
                  ``ground_truth``; exact token ids
The suite's reference tokenizer and prompt template rebuild each prompt: the problem is
recovered from the dump's prompt as what sits between the template's text before and after
``{problem}``. Text-only responses are re-tokenized (``token_method`` "text", flag
``retokenized``); a verl prompt, decoded without its special tokens, is flagged
``lossy_prompt``. Token-exact rows keep their ids (``token_method`` "generated"). The rows
are the reference's own samples only for a dump of the first step (verl ``1.jsonl``, TRL
``completions_00001``): ``--model`` names the checkpoint that sampled the others.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Optional

import pandas as pd

from rlprobe_nb.suite import paths, prompting

FORMATS = ("auto", "verl", "trl", "open-instruct")
MARK = "\u2063PROBLEM\u2063"


class ImportError_(ValueError):
    """A dump cannot be imported; the message names the file, the row and the fix."""


def detect(dump: Path) -> str:
    if dump.suffix == ".parquet":
        return "trl"
    with open(dump, encoding="utf-8") as f:
        first = json.loads(f.readline() or "{}")
    if "response_tokens" in first and "prompt_tokens" in first:
        return "open-instruct"
    if "input" in first and "output" in first:
        return "verl"
    raise ImportError_(f"{dump}: neither a TRL completions parquet, a verl rollout JSONL "
                       "(input, output, gts) nor open-instruct traces (prompt_tokens, "
                       f"response_tokens); its first row has {sorted(first)}. Pass --format")


def read_rows(dump: Path, fmt: str) -> list[dict]:
    """{"prompt": text or messages or ids, "response": text or ids, "gold", "finish"}."""
    if fmt == "trl":
        df = pd.read_parquet(dump)
        return [{"prompt": _plain(r["prompt"]), "response": _content(_plain(r["completion"])),
                 "gold": None, "finish": None} for _, r in df.iterrows()]
    rows = [json.loads(line) for line in dump.read_text(encoding="utf-8").splitlines() if line.strip()]
    if fmt == "verl":
        return [{"prompt": r["input"], "response": r["output"], "gold": _gold(r.get("gts")),
                 "finish": None} for r in rows]
    return [{"prompt": [int(i) for i in r["prompt_tokens"]],
             "response": [int(i) for i in r["response_tokens"]],
             "gold": _gold(r.get("ground_truth")), "finish": r.get("finish_reason")} for r in rows]


def _plain(value):
    """numpy arrays of messages (as pandas reads them) -> lists of dicts."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    return [dict(m) for m in value] if isinstance(value, list) else value


def _content(value) -> str:
    if isinstance(value, list):
        return "".join(str(m.get("content", "")) for m in value if m.get("role") == "assistant")
    return str(value)


def _gold(value) -> Optional[str]:
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value is None else str(value)


class Prompts:
    """The problem behind a dump's prompt, and the book's prompt ids for it."""

    def __init__(self, tokenizer, template: str):
        self.tok, self.template = tokenizer, template
        self.user_lead, _, self.user_trail = template.partition("{problem}")
        chat = tokenizer.decode(prompting.prompt_ids(tokenizer, MARK, template),
                                skip_special_tokens=True)
        self.chat_lead, _, self.chat_trail = chat.partition(MARK)

    def problem(self, prompt) -> tuple[Optional[str], str]:
        """(problem text or None, flag) from a prompt as the dump stores it."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            text, lead, trail = self.tok.decode(prompt, skip_special_tokens=True), \
                self.chat_lead, self.chat_trail
            flag = ""
        elif isinstance(prompt, list):
            users = [m["content"] for m in prompt if m.get("role") == "user"]
            text, lead, trail = (users[-1] if users else ""), self.user_lead, self.user_trail
            flag = "" if len(prompt) == len(users) == 1 else "other_messages_dropped"
        else:
            text, lead, trail = str(prompt), self.chat_lead, self.chat_trail
            if not (text.startswith(lead) and text.endswith(trail)):
                lead, trail = self.user_lead, self.user_trail
            flag = "lossy_prompt"
        if text.startswith(lead) and text.endswith(trail) and len(text) >= len(lead) + len(trail):
            return text[len(lead):len(text) - len(trail)], flag
        return None, flag


def build(rows: list[dict], tok, template: str, model: str, temperature: float,
          known: Optional[pd.DataFrame], dump: Path, grading: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    from rlprobe_nb.generation.rollouts import failure_type
    from rlprobe_nb.problems.grading import grade_many
    from rlprobe_nb.tables import schemas

    prompts = Prompts(tok, template)
    by_text = {} if known is None else {r.problem: (r.problem_id, r.answer)
                                        for r in known.itertuples(index=False)}
    out, problems, counts = [], {}, {}
    for i, row in enumerate(rows):
        problem, flag = prompts.problem(row["prompt"])
        if problem is None:
            raise ImportError_(f"{dump}, row {i}: its prompt is not the suite's prompt template "
                               f"({template!r}) around a problem; pass the run's template with "
                               "--prompt-template")
        pid, answer = by_text.get(problem, (None, None))
        pid = pid or "run/" + hashlib.sha1(problem.encode()).hexdigest()[:12]
        answer = answer if answer is not None else row["gold"]
        problems.setdefault(pid, {"unique_id": pid, "problem": problem, "answer": answer})
        sample = counts[pid] = counts.get(pid, -1) + 1
        exact = isinstance(row["response"], list)
        ids = row["response"] if exact else prompting.text_ids(tok, row["response"])
        flags = [f for f in (flag, "" if exact else "retokenized") if f]
        if not exact and prompting.special_token_texts(tok, row["response"]):
            flags.append("special_token_text")
        stored_prompt = row["prompt"] if exact else prompting.prompt_ids(tok, problem, template)
        out.append({"model": model, "problem_id": pid, "rollout_id": f"{pid}#{sample}",
                    "sample": sample, "temperature": temperature, "seed": None,
                    "prompt_ids": stored_prompt, "response_ids": ids,
                    "response": tok.decode(ids, skip_special_tokens=True) if exact else row["response"],
                    "n_tokens": len(ids), "finish_reason": (row["finish"] or "stop") if exact
                    else "imported", "token_method": "generated" if exact else "text",
                    "gold": answer, "flags": ",".join(flags)})
    df = pd.DataFrame(out)
    graded = df["gold"].notna()
    grades = grade_many(df.loc[graded, "response"].tolist(), df.loc[graded, "gold"].tolist(),
                        grading["timeout_s"], grading["workers"]) if graded.any() else []
    df["extracted"], df["grade_method"], df["n_boxes"], df["correct"] = None, "no_gold", 0, False
    for idx, g in zip(df.index[graded], grades):
        df.loc[idx, ["extracted", "grade_method", "n_boxes", "correct"]] = \
            [g.extracted, g.method, g.n_boxes, g.correct]
    df["failure_type"] = [failure_type(bool(c), f, g) for c, f, g in
                          zip(df["correct"], df["finish_reason"], df["grade_method"])]
    df.loc[~graded, "failure_type"] = "ungraded"
    df = df.astype({"n_boxes": "int16", "correct": bool})
    return df[schemas.ROLLOUTS.names], pd.DataFrame(list(problems.values()))


def write(df: pd.DataFrame, problems: pd.DataFrame, out: Path, stem: str) -> tuple[Path, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlprobe_nb.tables import schemas
    from rlprobe_nb.tables.atomic import atomic_path

    out.mkdir(parents=True, exist_ok=True)
    table_file, problems_file = out / f"rollouts_{stem}.parquet", out / f"problems_{stem}.jsonl"
    with atomic_path(table_file) as tmp:
        pq.write_table(pa.Table.from_pandas(df, schema=schemas.ROLLOUTS, preserve_index=False), tmp)
    with atomic_path(problems_file) as tmp:
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n"
                               for r in problems.to_dict("records")), encoding="utf-8")
    return table_file, problems_file


def read_imported(path: Path, problem_ids) -> pd.DataFrame:
    """The rows of an imported rollouts file (``write``'s parquet) whose problems are among
    ``problem_ids`` (chapter 02 with ``rollouts.source: imported``), checked: the book's
    rollouts schema, and at least one row of those problems."""
    import pyarrow.parquet as pq

    from rlprobe_nb.tables import schemas

    path = Path(path)
    if not path.is_file():
        raise ImportError_(f"rollouts.prior_path names {path}, which does not exist: run "
                           "python -m rlprobe_nb.import_rollouts DUMP --suite NAME first")
    table = pq.read_table(path)
    if not table.schema.equals(schemas.ROLLOUTS, check_metadata=False):
        raise ImportError_(f"{path} is not a rollouts table (its columns: "
                           f"{table.schema.names[:6]}…): give the parquet that "
                           "python -m rlprobe_nb.import_rollouts wrote")
    df = table.to_pandas()
    wanted = set(problem_ids)
    kept = df[df.problem_id.isin(wanted)].reset_index(drop=True)
    if kept.empty:
        raise ImportError_(f"{path} holds no rollout of the {len(wanted)} problems chapter 01 "
                           f"selected (its problems: {sorted(set(df.problem_id))[:3]}…): point "
                           "problems.path at the problems file the import wrote beside it")
    return kept


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlprobe_nb.import_rollouts",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("dump", type=Path)
    ap.add_argument("--suite", required=True, help="the suite whose reference tokenizer, "
                    "prompt template and grading settings are used")
    ap.add_argument("--format", default="auto", choices=FORMATS)
    ap.add_argument("--problems", help="a problems file (MATH schema) to take ids and answers from")
    ap.add_argument("--model", help="the model that sampled the dump (default: the reference)")
    ap.add_argument("--prompt-template", help="the run's template (default: the suite's)")
    ap.add_argument("--temperature", type=float, default=float("nan"))
    ap.add_argument("--out", type=Path, help="default: data/SUITE/imported/")
    args = ap.parse_args(argv)
    from rlprobe_nb.suite import models, params

    try:
        P = params.load(args.suite)
        fmt = detect(args.dump) if args.format == "auto" else args.format
        tok = models.load_tokenizer(P.reference, P)
        known = None
        if args.problems:
            from rlprobe_nb.problems.sources import from_file

            known = from_file(args.problems)
        df, problems = build(read_rows(args.dump, fmt), tok, args.prompt_template or
                             P.prompt_template, args.model or P.reference, args.temperature,
                             known, args.dump, {"timeout_s": P.grading.timeout_s,
                                                "workers": P.grading.workers})
    except (ImportError_, KeyError, ValueError) as exc:
        print(f"import_rollouts: {exc}", file=sys.stderr)
        return 2
    files = write(df, problems, args.out or paths.data_dir(args.suite) / "imported",
                  args.dump.stem)
    print(f"{args.dump} ({fmt}): {len(df)} rollouts of {len(problems)} problems, "
          f"{(df.token_method == 'text').sum()} re-tokenized from text, "
          f"{int(df.correct.sum())} correct -> {files[0]}, {files[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
