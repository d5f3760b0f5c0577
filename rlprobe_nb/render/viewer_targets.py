"""What the viewer's exported page shows for links from other chapters' pages.

A link from chapter 05 or 06 (``viewer_links``) opens, in an exported page, the viewer's
page at ``#open=<rollout>:<pos>``. Without a kernel the page cannot open any rollout on
demand, so it holds, one section each, the tokens the other chapters' pages link to: the
cases chapter 06 picks with its default rule and the strongest spikes and departures chapter
05 lists, each coloured at the final checkpoint with the token ringed, followed by that
token's values over steps and both models' top-k at every step. A section's ``id`` is the
fragment, so the link lands on it with no script; a small script says so when a link names
a token the page does not hold (06 run with another rule, say) and how to open it.
"""

from __future__ import annotations

import html

import pandas as pd

from rlprobe_nb.render.viewer_links import fragment

MISSING_NOTE = """<div id="rp-target-missing" style="display:none;font:13px sans-serif;background:#fff4d6;
 border:1px solid #e0b000;padding:6px 10px;margin:6px 0"></div>
<script>(function () {
  function check() {
    var box = document.getElementById("rp-target-missing"), id = decodeURIComponent(location.hash.slice(1));
    if (!box || id.indexOf("open=") !== 0) return;
    if (document.getElementById(location.hash.slice(1))) { box.style.display = "none"; return; }
    var parts = id.slice(5).split(":"), pos = parts.pop(), rollout = parts.join(":");
    box.textContent = "This page does not hold rollout " + rollout + ", token " + pos + ". In JupyterLab the link "
      + "opens the live viewer there; or run: papermill notebooks/07_viewer.ipynb out.ipynb -p rollout_id '"
      + rollout + "' -p token " + pos;
    box.style.display = "block";
  }
  window.addEventListener("hashchange", check);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", check); else check();
})();</script>"""


def linked_targets(tokens: pd.DataFrame, spikes: pd.DataFrame | None, n_top: int = 12) -> pd.DataFrame:
    """(rollout_id, pos, why) of every token the other chapters' pages link to by default:
    chapter 06's cases (its default rule) and chapter 05's strongest spikes (``n_top``)."""
    from rlprobe_nb.render import case_studies

    rows = []
    choices = case_studies.select_cases(tokens, spikes if spikes is not None else pd.DataFrame(
        columns=["checkpoint", "rollout_id", "pos", "significant"]), case_studies.CaseRule())
    for c in choices.itertuples(index=False):
        rows.append((c.rollout_id, int(c.pos), f"chapter 06, case {c.case}: {c.reason}"))
    if spikes is not None and len(spikes) and {"statistic", "divergence", "step", "significant"} <= set(spikes.columns):
        from rlprobe_nb.spikes.table import top_spikes

        for r in top_spikes(spikes, n=n_top).itertuples(index=False):
            rows.append((r.rollout_id, int(r.pos), "chapter 05, one of the strongest spikes"))
    out = pd.DataFrame(rows, columns=["rollout_id", "pos", "why"])
    return out.drop_duplicates(["rollout_id", "pos"]).reset_index(drop=True)


def targets_html(app, targets: pd.DataFrame) -> str:
    """One section per target (see the module doc); ``app``: the viewer, whose state is put
    back afterwards."""
    rollout, token, step = app.rollout.value, app.token.value, app.step.value
    parts = [MISSING_NOTE]
    try:
        for t in targets.itertuples(index=False):
            app.open(t.rollout_id, int(t.pos), app.checkpoints[-1])
            parts.append(f'<section id="{html.escape(fragment(t.rollout_id, t.pos), quote=True)}" '
                         f'class="rp-target" style="margin:18px 0">'
                         f"<h3 style='font:bold 14px sans-serif'>{html.escape(t.rollout_id)}, token {int(t.pos)}"
                         f" <small style='font-weight:normal'>({html.escape(t.why)})</small></h3>"
                         f"{app.static_html()}</section>")
    finally:
        app.open(rollout, token if token >= 0 else None, step)
    return "".join(parts)
