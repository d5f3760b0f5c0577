"""How values read on a page: a frame's plain-text form, which a notebook keeps beside its HTML."""

from rlprobe_nb import readable


def test_plain_text_of_a_frame_shows_no_nan_and_marks_whitespace():
    import numpy as np
    import pandas as pd

    df = pd.DataFrame({"matched_to": [np.nan, 1.0], "token": [" 4\n", None],
                       "n": pd.array([None, 3], dtype="Int64"), "f": [0.123456, np.nan]})
    text = readable.frame_text(df)
    assert "NaN" not in text and "<NA>" not in text and "None" not in text
    assert "␣4⏎" in text and "0.1235" in text and text.count("–") == 4


def test_html_of_a_frame_shows_no_missing_value_as_nan_or_na():
    """A nullable column (an onset step that has none) once printed <NA> in 05's and 08's pages."""
    import numpy as np
    import pandas as pd

    df = pd.DataFrame({"onset_step": pd.array([200, None], dtype="Int64"), "f": [0.123456, np.nan],
                       "s": pd.array(["x", None], dtype="string")})
    html = readable.frame_html(df)
    assert "<NA>" not in html and "&lt;NA&gt;" not in html and "NaN" not in html
    assert "200" in html and "0.1235" in html and html.count("–") == 3
