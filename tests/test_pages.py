"""The book as a reader meets it (issue 26, acceptance 3 and 4), on the small book's run:
a quiet log, pages that hide their code (by tags) and show no Python warnings, progress
bars at their final state, an index whose numbers are the tables', and every page linked
to its neighbours. Also the page parts on their own: the index's number tags, the chapter
parameters that papermill documents, the --checkpoint option."""

import json
import re
from html.parser import HTMLParser

import nbformat
import pandas as pd
import pytest

from rlprobe_nb import book
from rlprobe_nb.pages import navigation
from rlprobe_nb.readable import number
from rlprobe_nb.render import viewer_links
from rlprobe_nb.suite import params, paths
from rlprobe_nb.tables import storage

# What `make demo` must not print (issue 26): ipykernel's TCP warning, library warnings.
NOISE = ["Kernel is running over TCP without encryption", "FutureWarning", "DeprecationWarning",
         "is_gradient_checkpointing", "UserWarning"]
slow = [pytest.mark.slow, pytest.mark.timeout(3600)]


class Links(HTMLParser):
    """Every <a>'s attributes, in page order."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links.append(dict(attrs))


def links(page: str) -> list[dict]:
    found = Links()
    found.feed(page)
    return found.links


class Numbers(HTMLParser):
    """Every tagged number of a page: (its source, its text)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.numbers, self._open = [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "rp-num" in (attrs.get("class") or ""):
            self._open = [json.loads(attrs["data-src"]), ""]

    def handle_data(self, data):
        if self._open is not None:
            self._open[1] += data

    def handle_endtag(self, tag):
        if self._open is not None and tag == "span":
            self.numbers.append(tuple(self._open))
            self._open = None


def recomputed(src: dict, data_dir):
    """A headline number from its table, computed here independently of ``headlines``."""
    from rlprobe_nb.spikes import onsets

    df = storage.read_table(data_dir / src["table"])
    for col, value in src["where"].items():
        df = df[df[col].astype(object) == value]
    col = src["column"]
    return {"count": lambda: len(df), "nunique": lambda: df[col].nunique(),
            "mean": lambda: df[col].astype(float).mean(), "max": lambda: df[col].max(),
            "value": lambda: df[col].iloc[0],
            # chapter 05's onset rule over the rows of a table of departures by label
            "onset_step": lambda: int(onsets.onsets(df).onset_step.iloc[0]),
            "onsets": lambda: int((onsets.onsets(df).status == "onset").sum())}[src["agg"]]()


def written(src: dict, value) -> str:
    """A tagged number as the page writes it (``headlines.FORMATS``)."""
    from rlprobe_nb.reporting import fmt

    return {"number": number, "fmt": fmt,
            "signed": lambda x: fmt(x, signed=True)}[src.get("format", "number")](value)


def book_pages(book_run, monkeypatch):
    for name in ("RLPROBE_OUT", "RLPROBE_PARAMS"):
        monkeypatch.setenv(name, book_run["env"][name])
    return navigation.book_pages(book.runs(params.load("demo")))


@pytest.mark.parametrize("noise", NOISE)
@pytest.mark.slow
def test_the_books_log_is_quiet(small_book, noise):
    assert noise not in small_book["log"], small_book["log"][-3000:]


@pytest.mark.slow
def test_pages_hide_their_code_show_no_warnings_and_final_progress(small_book, monkeypatch):
    figures = small_book["figures"]
    for page in book_pages(small_book, monkeypatch):
        html = (figures / f"{page.stem}.html").read_text(encoding="utf-8")
        cells = re.findall(r'<div[^>]*class="jp-Cell jp-CodeCell[^"]*"', html)
        assert cells and all("celltag_hide-input" in c or "celltag_show-input" in c for c in cells), page.stem
        assert 'id="rp-show-code"' in html, "the show-code switch"
        nb = nbformat.read(figures / f"{page.stem}.ipynb", 4)
        streams = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "stream"]
        errs = [o["text"] for o in streams if o["name"] == "stderr"]
        assert not any(w in t for t in errs for w in NOISE), (page.stem, errs)
        assert not [w for w in NOISE if w in html], page.stem
        # a progress bar's last state in the page is its final one (100%), never 0%
        bars = re.findall(r"[\w ]+:\s+(\d+)%\|", re.sub(r"<[^>]+>", "", html))
        assert all(b == "100" for b in bars), (page.stem, bars)


@pytest.mark.slow
def test_the_index_lists_every_chapter_with_the_tables_numbers(small_book, monkeypatch):
    pages = book_pages(small_book, monkeypatch)
    index = (small_book["figures"] / "index.html").read_text(encoding="utf-8")
    chapters = re.findall(r'<section class="rp-chapter" data-chapter="([^"]+)"', index)
    assert chapters == list(dict.fromkeys(p.chapter for p in pages)), "every chapter, in order"
    for page in pages:
        assert f'href="{page.stem}.html"' in index, f"{page.stem} linked"
    found = Numbers()
    found.feed(index)
    tables = {src["table"].split("/")[0] for src, _ in found.numbers}
    assert {"selection", "rollouts", "tokens", "divergence_when", "spikes", "branches"} <= tables
    for src, text in found.numbers:
        assert text == written(src, recomputed(src, small_book["data"])), (src, text)
    assert "NaN" not in index and "nan" not in re.sub(r"<[^>]+>", "", index).split()


@pytest.mark.slow
def test_every_page_links_to_its_neighbours(small_book, monkeypatch):
    pages = book_pages(small_book, monkeypatch)
    stems = [navigation.INDEX] + [p.stem for p in pages] + [navigation.INDEX]
    for i, page in enumerate(pages, 1):
        found = links((small_book["figures"] / f"{page.stem}.html").read_text(encoding="utf-8"))
        rels = [(a.get("rel"), a.get("href")) for a in found if a.get("rel")]
        assert rels.count(("prev", f"{stems[i - 1]}.html")) == 2, (page.stem, rels)  # top and bottom bars
        assert rels.count(("next", f"{stems[i + 1]}.html")) == 2, (page.stem, rels)
    index = links((small_book["figures"] / "index.html").read_text(encoding="utf-8"))
    assert {"rel": "next", "href": f"{pages[0].stem}.html"} in index


def viewer_page_data(figures) -> dict:
    """The numbers the viewer's page holds (``render.page_viewer``)."""
    page = (figures / "07_viewer.html").read_text(encoding="utf-8")
    found = re.search(r"<script[^>]*class=.rp-viewer-data.[^>]*>(.*?)</script>", page, re.S)
    assert found, "the viewer's page holds its viewer's data"
    return json.loads(found.group(1))


@pytest.mark.slow
def test_links_from_05_and_06_point_at_the_viewers_page_which_holds_them(small_book):
    figures = small_book["figures"]
    held = {r["id"]: set(r["pos"]) for r in viewer_page_data(figures)["rollouts"]}
    for chapter in ("05_spikes", "06_case_studies"):
        found = [a for a in links((figures / f"{chapter}.html").read_text(encoding="utf-8"))
                 if "rp-open" in (a.get("class") or "")]
        assert found, chapter
        for a in found:
            page, _, frag = a["href"].partition("#")
            assert page == "07_viewer.html" and frag.startswith("open="), a
            rollout, pos = viewer_links.parse_fragment(frag)
            assert pos in held.get(rollout, ()), f"{chapter} links to {rollout}:{pos}, which 07's page lacks"


@pytest.mark.slow
def test_pages_share_their_scripts_and_styles_and_stay_small(small_book):
    """Every page once carried the Vega scripts (0.9 MB) and JupyterLab's styles (0.26 MB)."""
    figures = small_book["figures"]
    pages = sorted(figures.glob("*.html"))
    shared = sorted(figures.glob("vega-*.js")) + sorted(figures.glob("lab-*.css"))
    assert [p.suffix for p in shared] == [".js", ".css"], "one file each"
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert "vegaEmbed=" not in html.replace(" ", "") and "--jp-layout-color0:" not in html, page.name
        if 'class="rp-vega"' in html:
            assert f'src="{shared[0].name}"' in html, page.name
        assert f'href="{shared[1].name}"' in html or page.name == "index.html", page.name
    total = sum(p.stat().st_size for p in pages + shared)
    print(f"{len(pages)} pages and {len(shared)} shared files: {total / 1e6:.2f} MB")
    assert total <= 8e6


def test_the_index_page_tags_every_number_and_says_what_is_missing(tmp_path):
    pages = [navigation.Page("01_a", "01", "01 · A: first?"), navigation.Page("03_b__x", "03", "03 · B: per x?", "checkpoint x"),
             navigation.Page("03_b__y", "03", "03 · B: per x?", "checkpoint y")]
    (tmp_path / "01_a.html").write_text("page")
    html = navigation.index_html("demo", pages, tmp_path, {"01_a": ['<span class="rp-num" data-src="{}">3</span> problems.']})
    assert html.count('<section class="rp-chapter"') == 2, "one section per chapter, its runs inside"
    assert '<a href="01_a.html">01 · A: first?</a>' in html and "checkpoint x <i>(not run yet)</i>" in html
    assert "3</span> problems." in html
    assert navigation.neighbours(pages, "03_b__x") == (pages[0], pages[2])
    assert navigation.neighbours(pages, "01_a")[0] is None, "the first page's previous is the index"


CHAPTERS = sorted(p for p in paths.notebooks_dir().glob("0*.ipynb"))


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.stem)
def test_papermill_documents_every_chapter_parameter(notebook):
    import papermill as pm

    found = pm.inspect_notebook(str(notebook))
    cell = next(c for c in nbformat.read(notebook, 4).cells if "parameters" in c.metadata.get("tags", []))
    declared = [line.split(":")[0] for line in cell.source.splitlines() if line.strip()]
    assert list(found) == declared, "every declared parameter listed (papermill cannot read `X | None`)"
    for name, p in found.items():
        assert p["inferred_type_name"] not in ("None", ""), f"{name}: no type"
        assert p["help"].strip(), f"{name}: no help"


def test_the_checkpoint_option_keeps_only_those_runs_of_03(monkeypatch, capsys):
    monkeypatch.delenv("RLPROBE_SUITE", raising=False)
    P = params.load("demo")
    plan = book.runs(P, ["03"], checkpoints=["rlvr_step_1200"])
    assert [(nb.stem, p["checkpoint"], stem) for nb, p, stem in plan] == [
        ("03_teacher_forcing", "rlvr_step_1200", "03_teacher_forcing__rlvr_step_1200")]
    assert book.main(["--only", "03", "--checkpoint", "rlvr_step_1300"]) == 2
    said = capsys.readouterr().err
    assert "rlvr_step_1300" in said and "rlvr_step_1200" in said, "names the valid checkpoints"


def test_the_first_run_of_03_forces_every_checkpoint_and_the_rest_read_two_at_a_time(monkeypatch):
    monkeypatch.delenv("RLPROBE_SUITE", raising=False)
    P = params.load("demo")
    plan = book.runs(P)
    first = next(i for i, (nb, _, _) in enumerate(plan) if nb.stem == book.PER_CHECKPOINT)
    assert plan[first][1]["checkpoints"] == P.forced
    assert all("checkpoints" not in p for _, p, _ in plan[first + 1:])
    waves = book.waves(plan)  # a GPU: one run at a time but for the readers
    assert [i for wave in waves for lane in wave for i in lane] == list(range(len(plan)))
    readers = [w for w in waves if len(w) > 1]
    assert readers and all(len(w) == book.READERS_AT_ONCE for w in readers[:-1])
    assert all(len(lane) == 1 for w in waves for lane in w)
    assert {plan[i][0].stem for w in readers for lane in w for i in lane} == {book.PER_CHECKPOINT}
    assert [[first]] in waves, "the run that forces every checkpoint runs alone"
    # a CPU: after the forcing run, two lanes: 09 beside the readers, 04-08 and after
    lanes = book.waves(plan, lanes=True)
    assert lanes[:first + 1] == [[[i]] for i in range(first + 1)]
    (main, side), = lanes[first + 1:]
    assert [plan[i][2] for i in side] == ["09_takeover"]
    assert [plan[i][2][:2] for i in main] == ["03"] * (len(P.forced) - 1) + [
        "04", "05", "06", "07", "08", "ap"]
    assert sorted(main + side) == list(range(first + 1, len(plan)))
    # one checkpoint asked for: nothing is forced ahead, everything runs alone
    alone = book.runs(P, ["03"], checkpoints=["rlvr_step_1200"])
    assert book.waves(alone) == [[[0]]] and "checkpoints" not in alone[0][1]


def test_the_lab_styles_move_to_one_file_beside_the_pages(tmp_path):
    from rlprobe_nb.pages import page_styles

    def page(body: str) -> str:
        return (f"<html><head><style>.mine{{}}</style>{page_styles.START}<style type='text/css'>\n"
                f"  .jp-Cell{{color:red}}\n</style><style>a{{b:c}}</style>{page_styles.END}</head>"
                f"<body>{body}</body></html>")

    first, second = page_styles.share(page("one"), tmp_path), page_styles.share(page("two"), tmp_path)
    files = list(tmp_path.glob("lab-*.css"))
    assert len(files) == 1 and files[0].read_text() == ".jp-Cell{color:red}\na{b:c}\n", "one file, written once"
    assert first == f'<html><head><style>.mine{{}}</style><link rel="stylesheet" href="{files[0].name}"></head>' \
                    "<body>one</body></html>" and "two" in second
    with pytest.raises(ValueError, match="no marked styles"):
        page_styles.share("<html></html>", tmp_path)


def test_a_chart_saved_beside_its_page_shows_that_file_until_drawn(tmp_path):
    import altair as alt
    import pandas as pd

    from rlprobe_nb import views
    from rlprobe_nb.pages import charts

    chart = alt.Chart(pd.DataFrame({"x": [1, 2], "y": [3, 4]}), title="a chart").mark_point().encode(x="x", y="y")
    shown = views.show(chart, save_as=tmp_path / "01_points")
    spec = shown._repr_mimebundle_()[views.VEGALITE_MIMETYPE]
    beside = charts.chart_html(spec, shown.svg, tmp_path)
    assert '<img class="rp-vega-static" loading="lazy" src="01_points.svg" alt="a chart">' in beside
    assert "<svg" not in beside, "the SVG not carried twice"
    elsewhere = charts.chart_html(spec, shown.svg, tmp_path / "another")
    assert '<div class="rp-vega-static"><svg' in elsewhere, "no file beside the page: the SVG inline"


def test_a_page_leaves_out_progress_bars_and_this_machines_folders(monkeypatch, tmp_path):
    from rlprobe_nb.pages import for_reader

    out = tmp_path / "out"
    monkeypatch.setenv("RLPROBE_OUT", str(out))
    monkeypatch.setenv("RLPROBE_CACHE", str(tmp_path / "cache"))
    bar = "branches_shards shards: 100%|██████████| 4/4 [00:12<00:00,  3.01s/it]"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[
        nbformat.v4.new_output("stream", name="stdout",
                               text=f"scoring:  50%|█    | 2/4 [00:01<00:01]\r{bar}\n"
                                    f"reusing {out}/data/demo/tokens/a: complete\n"),
        nbformat.v4.new_output("stream", name="stdout", text=f"12it [00:01, 10.2it/s]\n"),
        nbformat.v4.new_output("display_data", data={
            "text/plain": f"{tmp_path}/cache/models/x.safetensors",
            "text/html": f"<td>{paths.REPO_ROOT}/params/demo/suite.yaml</td><td>{out}</td>"})])])
    for_reader.for_reader(nb)
    outputs = nb.cells[0].outputs
    assert len(outputs) == 2, "a stream holding only a bar, or only the build's log, is dropped"
    assert "<summary>How this page was made</summary>" in outputs[0].data["text/html"]
    assert outputs[0].data["text/plain"] == "reusing data/demo/tokens/a: complete\n"
    assert outputs[1].data["text/plain"] == "$RLPROBE_CACHE/models/x.safetensors"
    assert outputs[1].data["text/html"] == "<td>params/demo/suite.yaml</td><td>.</td>"


def reader_problems(small_book) -> dict[str, list[str]]:
    from page_text import problems

    folders = [str(paths.REPO_ROOT.resolve()), str(small_book["out"].resolve())]
    found = {}
    for page in sorted(small_book["figures"].glob("*.html")):
        if ".FAILED" not in page.name:
            found[page.stem] = problems(page.read_text(encoding="utf-8"), folders)
    return found


@pytest.mark.slow
def test_no_page_shows_the_build_machine_bars_reprs_placeholders_or_cut_commands(small_book):
    """Issue 41, acceptance 2: no absolute folder of the checkout or of where the book was
    written, no progress bar, no pandas repr, no None/nan, no "(s)", no command cut by "…"."""
    found = reader_problems(small_book)
    assert len(found) >= 10 and "index" in found
    bad = {stem: said for stem, said in found.items() if said}
    assert bad == {}, bad


@pytest.mark.slow
def test_every_spike_row_carries_its_tokens_category(small_book, monkeypatch):
    """Issue 41, acceptance 2: the spikes table's category is chapter 04's category of the
    written token wherever the classifier gives one (it gives one to every token)."""
    from rlprobe_nb.divergence import token_categories

    for name in ("RLPROBE_OUT", "RLPROBE_PARAMS"):
        monkeypatch.setenv(name, small_book["env"][name])
    spikes = storage.read_table(small_book["data"] / "spikes")
    assert len(spikes), "the small book has spike rows to check"
    P = params.load("demo")
    ckpt = spikes.checkpoint.iloc[0]
    tokens = storage.read_table(paths.table_dir(P.suite, paths.token_table_name(ckpt, P.reference)))
    expected = token_categories.classify(tokens).astype(str)
    at = pd.MultiIndex.from_frame(tokens[["rollout_id", "pos"]])
    want = expected.to_numpy()[at.get_indexer(pd.MultiIndex.from_frame(spikes[["rollout_id", "pos"]]))]
    assert spikes.category.notna().all() and (spikes.category.str.len() > 0).all()
    assert (spikes.category.to_numpy() == want).all()


@pytest.mark.slow
def test_the_index_opens_with_the_answer_each_number_printed_by_the_page_it_links(small_book):
    """Issue 41, acceptance 1: the findings paragraph holds three or more numbers read from
    the tables (the tags are checked against them above), and each is printed, as written,
    by a page the paragraph links to."""
    from page_text import PageText

    index = (small_book["figures"] / "index.html").read_text(encoding="utf-8")
    found = re.search(r'<p class="rp-findings">(.*?)</p>', index, re.S)
    assert found and index.index("rp-findings") < index.index('class="rp-chapter"'), "first"
    numbers = Numbers()
    numbers.feed(found.group(1))
    assert len(numbers.numbers) >= 3, found.group(1)
    linked = {a["href"].split("#")[0] for a in links(found.group(1)) if a.get("href")}
    texts = {}
    for page in linked:
        shown = PageText()
        shown.feed((small_book["figures"] / page).read_text(encoding="utf-8"))
        texts[page] = shown.text.replace("−", "-")
    for _, text in numbers.numbers:
        assert any(text.replace("−", "-") in t for t in texts.values()), (text, sorted(linked))


def chart_specs(executed) -> list[dict]:
    """Every Vega-Lite spec an executed notebook displays."""
    out = []
    for cell in nbformat.read(executed, 4).cells:
        for o in cell.get("outputs", []):
            out += [v for k, v in o.get("data", {}).items() if k.startswith("application/vnd.vegalite")]
    return out


# Chart values that cannot be negative (a KL, JS, an entropy, k2, k3) and shares that lie in
# [0, 1] (accuracies, pass rates, shares of positions): an interval drawn beyond them shows
# the method's artefact, not the data (issue 41: a bootstrap-t interval reached -1 nats).
NONNEGATIVE = {"kl_ckpt_ref", "kl_ref_ckpt", "js", "entropy_ckpt", "entropy_ref", "k2", "k3"}
SHARES = ("accuracy", "rate", "pass_rate", "share", "disagreements")


def interval_problems(row: dict) -> list[str]:
    """What is wrong with one chart row's interval: bounds out of order, the estimate
    outside them, a non-negative metric's or a share's interval beyond its possible range."""
    bad = []
    for lo, hi in (("low", "high"), ("wilson_low", "wilson_high")):
        a, b = row.get(lo), row.get(hi)
        if not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
            continue
        if a > b + 1e-12:
            bad.append(f"{lo} {a} > {hi} {b}")
        est = next((row[c] for c in ("estimate", "mean", "accuracy", "rate", "pass_rate")
                    if isinstance(row.get(c), (int, float))), None)
        if est is not None and not a - 1e-9 <= est <= b + 1e-9:
            bad.append(f"estimate {est} outside [{a}, {b}]")
        if str(row.get("metric") or row.get("statistic") or "") in NONNEGATIVE and a < -1e-9:
            bad.append(f"{row.get('metric') or row.get('statistic')}: interval below 0 ({a})")
        if any(c in row for c in SHARES) and "arm" not in row and (a < -1e-9 or b > 1 + 1e-9):
            bad.append(f"a share's interval beyond [0, 1]: [{a}, {b}]")
    return bad


@pytest.mark.slow
def test_no_chart_draws_an_interval_beyond_what_its_values_can_be(small_book):
    """Issue 41, acceptance 3: every interval of every chart of every page lies within
    the range its value can take, and holds its estimate."""
    found, rows = [], 0
    for executed in sorted(small_book["figures"].glob("*.ipynb")):
        for spec in chart_specs(executed):
            for data in spec.get("datasets", {}).values():
                for row in data:
                    rows += 1
                    found += [f"{executed.stem}: {why}" for why in interval_problems(row)]
    assert rows > 100 and found == [], found[:10]
    assert interval_problems({"metric": "kl_ref_ckpt", "estimate": 0.07, "low": -0.2, "high": 1.0})
    assert interval_problems({"accuracy": 0.9, "low": 0.8, "high": 1.2})


def sub_charts(spec: dict):
    yield spec
    for key in ("hconcat", "vconcat", "concat", "layer"):
        for part in spec.get(key, []):
            yield from sub_charts(part)


def rows_of(part: dict, top: dict) -> list[dict]:
    name = (part.get("data") or {}).get("name")
    return top.get("datasets", {}).get(name, []) if name else (part.get("data") or {}).get("values", [])


@pytest.mark.slow
def test_04s_accuracy_panel_draws_one_coloured_series_per_run(small_book):
    """Issue 41, acceptance 3: the RLVR and placebo accuracies were one uncoloured zigzag."""
    spec = next(s for s in chart_specs(small_book["figures"] / "04_divergence.ipynb")
                if any(p.get("title") == "Accuracy" for p in sub_charts(s)))
    panel = next(p for p in sub_charts(spec) if p.get("title") == "Accuracy")
    lines = [p for p in sub_charts(panel) if (p.get("mark") or {}) in ("line",) or
             (isinstance(p.get("mark"), dict) and p["mark"].get("type") == "line")]
    assert lines and all(p["encoding"]["color"]["field"] == "run" for p in lines)
    rows = rows_of(lines[0], spec) or rows_of(panel, spec)
    runs = {}
    for r in rows:
        runs.setdefault(r["run"], []).append(r["step"])
    assert {"RLVR", "placebo (reward permuted)"} <= set(runs), sorted(runs)
    assert all(0 in steps and len(steps) == len(set(steps)) for steps in runs.values()), runs


@pytest.mark.slow
def test_05s_persistent_spike_rows_are_labelled_by_their_token_first(small_book):
    """Issue 41, acceptance 3: a row label was cut (at 180 px) before the spike's token."""
    from rlprobe_nb.spikes.charts import LABEL_LIMIT

    spec = next(s for s in chart_specs(small_book["figures"] / "05_spikes.ipynb")
                if any("persistent spikes ordered by onset" in json.dumps(p.get("title", ""))
                       for p in sub_charts(s)))
    y = next(p["encoding"]["y"] for p in sub_charts(spec) if "y" in p.get("encoding", {}))
    labels = y["sort"]
    assert labels and y["axis"]["labelLimit"] >= LABEL_LIMIT
    # 10-px labels: the token's bracket within the first ~40 characters, well inside the limit
    assert all(0 <= label.find("[") < 40 for label in labels), labels[:3]
