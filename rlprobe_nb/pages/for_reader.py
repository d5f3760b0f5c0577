"""What an executed notebook's outputs lose on the way to its page: what only the machine
that built it needs.

- **Progress bars.** A bar says how a long loop went while it ran; on a page it is noise
  (22 lines of bars on one run of 03). Lines of a stream output that are tqdm bars
  (``desc: 100%|█████| 16/16 [00:01<00:00, …]``) are left out of the page; the executed
  notebook keeps them.
- **Absolute paths.** The folders of the checkout that built the book mean nothing on
  another machine: a path under the folder the book writes to (``paths.out_root``) or
  under the checkout is shown relative to it (``data/demo/tokens/…``); a path under a
  folder moved elsewhere by its environment variable is named by that variable
  (``$RLPROBE_CACHE/models/…``).

- **The build's log.** What a chapter says about its tables (``reusing …``, ``computing
  …``, ``recomputing …``: the book's promise that nothing stale is served) is kept, folded
  under "How this page was made" where the chapter printed it.

The first two apply to every text output (streams, plain text, HTML, markdown) of every page.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rlprobe_nb.suite import paths

# tqdm's bar: "<desc>: <n>%|<bar>| <done>/<total> [<elapsed><<left>, <rate>]", or its
# "<n>it [..]" form without a total.
PROGRESS_BAR = re.compile(r"^.*?(?:\d{1,3}%\|.*\|\s*\S+/\S+|\d+it)\s*\[[^\]]*\]\s*$")
TEXT_TYPES = ("text/plain", "text/html", "text/markdown", "text/latex")
BUILD_LOG = re.compile(r"^(?:reusing|computing|recomputing) ")
MADE = "How this page was made"


def roots() -> list[tuple[str, str]]:
    """(absolute folder, what a page shows instead), the longest folder first."""
    named = [(paths.out_root(), ""), (paths.REPO_ROOT.resolve(), ""),
             (paths.cache_dir(), "$RLPROBE_CACHE/"), (paths.params_dir(), "$RLPROBE_PARAMS/")]
    out = {}
    for folder, shown in named:
        for spelled in {str(folder), os.path.realpath(folder)}:
            if spelled not in out and spelled != "/":
                # a folder under the checkout keeps its place in it (.cache/, params/)
                inside = Path(spelled).is_relative_to(paths.REPO_ROOT.resolve()) and shown
                out[spelled] = (str(Path(spelled).relative_to(paths.REPO_ROOT.resolve())) + "/"
                                if inside else shown)
    return sorted(out.items(), key=lambda kv: -len(kv[0]))


def relative_paths(text: str, folders: list[tuple[str, str]] | None = None) -> str:
    """``text`` with each absolute folder of ``roots()`` (followed by ``/``) replaced by what
    a page shows instead; the folder alone becomes ``.`` (or its variable)."""
    for folder, shown in folders if folders is not None else roots():
        text = text.replace(folder + "/", shown)
        text = re.sub(re.escape(folder) + r"(?![\w.-])", shown.rstrip("/") or ".", text)
    return text


def without_progress_bars(text: str) -> str:
    """``text`` without the lines that are tqdm bars (a carriage return starts a line)."""
    lines = re.split(r"(?<=\n)", text.replace("\r\n", "\n"))
    kept = [line for line in lines
            if not PROGRESS_BAR.match(line.rsplit("\r", 1)[-1].rstrip("\n"))]
    return "".join(kept)


def folded_log(lines: list[str]):
    """The build's log lines as a closed "How this page was made" block (an output)."""
    import html

    import nbformat

    body = html.escape("".join(lines))
    return nbformat.v4.new_output("display_data", data={
        "text/html": f'<details class="rp-made"><summary>{MADE}</summary>'
                     f'<pre style="white-space:pre-wrap">{body}</pre></details>',
        "text/plain": "".join(lines)})


def for_reader(nb) -> None:
    """Clean every text output of ``nb`` (an nbformat notebook) in place: no progress bar,
    no absolute path of this machine, the build's log folded. A stream left empty is
    dropped."""
    folders = roots()
    for cell in nb.cells:
        kept = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                text = relative_paths(without_progress_bars(output.get("text", "")), folders)
                lines = text.splitlines(keepends=True)
                log = [line for line in lines if BUILD_LOG.match(line)]
                output["text"] = "".join(line for line in lines if not BUILD_LOG.match(line))
                if log:
                    kept.append(folded_log(log))
                if not output["text"].strip():
                    continue
            for mime in TEXT_TYPES:
                data = output.get("data", {})
                if isinstance(data.get(mime), str):
                    data[mime] = relative_paths(data[mime], folders)
            kept.append(output)
        if "outputs" in cell:
            cell["outputs"] = kept
