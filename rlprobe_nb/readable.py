"""How values read on a page: numbers to meaningful digits, token text with its whitespace
visible, and tables (DataFrames) shown with both.

Numbers: four significant digits, trailing zeros dropped (``0.01235``, ``12.35``, ``0.5``),
scientific notation only below 0.001 or from 100,000 up (``1.2e-5``), integers in full, a
missing value as an en dash (never "NaN"); ±∞ as themselves (the book's tables should hold
none).

Token text: every whitespace or control character becomes one mark a reader can see,

    space ␣   newline ⏎   tab ⇥   carriage return ␍   other C0 controls ␀…␟   DEL ␡

and everything else stays exactly as it is: a backslash is one backslash (``\\frac`` reads
as written). A text that itself contains one of the marks is rare in model output;
:func:`ambiguous` says whether it does.

Inside a Jupyter kernel, importing the package registers :func:`frame_html` as the HTML
form of every DataFrame the notebook displays (``install``), so the book's tables read the
same way in JupyterLab and in the exported pages without a call in every chapter.
"""

from __future__ import annotations

import math
import numbers

MARKS = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍", "\x7f": "␡"}
# Columns of token text (shown with visible whitespace); other text columns are left as is.
TOKEN_COLUMNS = ("token", "written_token", "substituted_token", "moved_to_token", "argmax_token", "top_token")


def _mark(ch: str) -> str:
    if ch in MARKS:
        return MARKS[ch]
    code = ord(ch)
    return chr(0x2400 + code) if code < 0x20 else ch  # the Control Pictures block


def visible(text) -> str:
    """``text`` with each whitespace or control character replaced by its mark."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return "–"
    return "".join(_mark(ch) for ch in str(text))


def quoted(text) -> str:
    """A token on one line, between double quotes, its whitespace visible: ``"␣the"``."""
    return f'"{visible("" if text is None else text)}"'


def ambiguous(text: str) -> bool:
    """True if ``text`` already contains one of the marks (its visible form reads two ways)."""
    marks = set(MARKS.values()) | {chr(0x2400 + c) for c in range(0x20)}
    return any(ch in marks for ch in str(text))


def number(x, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits (see the module doc)."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, numbers.Integral):
        return f"{int(x):,}" if abs(int(x)) >= 100_000 else str(int(x))
    x = float(x)
    if math.isnan(x):
        return "–"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if x == 0:
        return "0"
    if x.is_integer() and abs(x) < 1e15:
        return number(int(x), digits)
    magnitude = math.floor(math.log10(abs(x)))
    if magnitude < -3 or magnitude >= 5:
        mantissa, exponent = f"{x:.{max(digits - 2, 1)}e}".split("e")
        return f"{_trim(mantissa)}e{int(exponent)}"
    decimals = max(digits - 1 - magnitude, 0)
    return _trim(f"{x:.{decimals}f}")


def counted(count, noun: str) -> str:
    """``count`` and its noun, plural unless the count is one ("1 problem", "3 problems")."""
    count = int(count)
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _trim(text: str) -> str:
    """Trailing zeros of a decimal fraction dropped (``0.5000`` -> ``0.5``, ``3.0`` -> ``3``)."""
    return text.rstrip("0").rstrip(".") if "." in text else text


def _plain(value) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def is_token_column(name) -> bool:
    return isinstance(name, str) and (name in TOKEN_COLUMNS or name.endswith("_token"))


def frame_html(df, html_columns: tuple = ()) -> str:
    """A DataFrame as HTML the way pandas shows it (rows and columns truncated by its display
    options, every cell in full), numbers to meaningful digits, token columns with visible whitespace;
    ``html_columns`` hold HTML already (e.g. links), every other text is escaped."""
    import html

    import pandas as pd

    df = _without_nullable_na(df)
    text = [c for c in df.columns if c not in html_columns and not pd.api.types.is_numeric_dtype(df[c])]
    formatters = {c: visible for c in text if is_token_column(c)}
    if html_columns:  # pandas escapes all or nothing: escape the others here
        formatters = {c: (lambda f: lambda v: html.escape((f or _plain)(v)))(formatters.get(c)) for c in text}
    # every cell in full: the page wraps a long cell at its spaces (``pages.wide_tables``);
    # pandas' cut at 50 characters ended commands in "..." and words mid-way
    with pd.option_context("display.max_colwidth", None):
        return df.to_html(formatters=formatters or None, float_format=number, na_rep="–", notebook=True,
                          escape=not html_columns,
                          max_rows=pd.get_option("display.max_rows"), max_cols=pd.get_option("display.max_columns"),
                          show_dimensions=pd.get_option("display.show_dimensions") is True, border=1)


def frame_text(df) -> str:
    """A DataFrame as plain text the way :func:`frame_html` shows it: numbers to meaningful
    digits, a missing value as an en dash (the text form a notebook keeps beside the HTML)."""
    import pandas as pd

    def cell(column):
        show = (number if pd.api.types.is_numeric_dtype(df[column]) and
                not pd.api.types.is_bool_dtype(df[column])
                else visible if is_token_column(column) else str)
        return lambda v: "–" if _missing(v) or (isinstance(v, str) and v == "–") else show(v)

    formatters = {c: cell(c) for c in df.columns}
    with pd.option_context("display.max_colwidth", None):
        return _frame_text(df, formatters)


def _frame_text(df, formatters) -> str:
    import pandas as pd

    return _without_nullable_na(df).to_string(formatters=formatters, na_rep="–",
                        max_rows=pd.get_option("display.max_rows"),
                        max_cols=pd.get_option("display.max_columns"))


def _without_nullable_na(df):
    """``df`` with a missing value of a nullable (extension) column or of a text (object)
    column written as an en dash: pandas prints <NA> in the first whatever ``na_rep`` says,
    and "None" in a column where every value is missing."""
    import pandas as pd

    shown = [c for c in df.columns
             if (isinstance(df[c].dtype, pd.api.extensions.ExtensionDtype) or df[c].dtype == object)
             and any(_missing(v) for v in df[c])]
    if not shown:
        return df
    return df.assign(**{c: pd.Series(["–" if _missing(v) else v for v in df[c]], index=df.index,
                                     dtype=object) for c in shown})


def _missing(value) -> bool:
    import pandas as pd

    try:
        return value is None or bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or array cell
        return False


def install() -> bool:
    """Register :func:`frame_html` and :func:`frame_text` for DataFrames in the running
    IPython; False outside one."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    import pandas as pd

    shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, frame_html)
    shell.display_formatter.formatters["text/plain"].for_type(
        pd.DataFrame, lambda df, printer, cycle: printer.text(frame_text(df)))
    return True
