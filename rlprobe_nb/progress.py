"""Progress bars that read the same in a terminal, a live notebook and an exported page.

Inside a Jupyter kernel ``tqdm.auto`` draws an ipywidgets bar. A page exported from the
executed notebook cannot draw it without the widget manager's script from a CDN, so
offline the bar is an empty box. The book's own loops use ``tqdm`` from here instead:
tqdm's plain-text bar everywhere, which in a kernel writes to stdout (stderr shows as an
alarming red block in a notebook) and refreshes at most every ``KERNEL_MININTERVAL``
seconds, since every refresh is kept in the notebook's output. Inside a kernel every bar
also keeps its final line (``leave=True`` whatever the caller asked) and draws on the
current line (``position=0``: a nested bar's cursor moves are not understood by a notebook
and left the outer bar's first state behind): the executed notebook keeps each bar's final
state. An exported page leaves the bars out (``pages.for_reader``): they tell how a run went,
not what it found.

The libraries' own bars are switched by ``quiet_library_progress()``, which importing
this module runs once inside a kernel:

- transformers ("Loading weights", generation helpers) goes through its public tqdm
  hook and gets the same plain-text bar;
- datasets and huggingface_hub subclass ``tqdm.auto``'s widget bar when they are
  imported and offer no public way to change its class, so inside a kernel their bars
  are turned off with their own ``disable_progress_bars()`` (downloads and map steps
  then run without a bar; in a terminal they keep theirs).
"""

from __future__ import annotations

import sys

from tqdm.std import tqdm as _text_tqdm

# Seconds between redraws inside a kernel: each redraw stays in the saved notebook.
KERNEL_MININTERVAL = 2.0


def in_kernel() -> bool:
    """True inside a Jupyter (IPython) kernel, the case where ``tqdm.auto`` picks widgets."""
    return "ipykernel.zmqshell" in sys.modules


class tqdm(_text_tqdm):
    """tqdm's plain-text bar; inside a kernel on stdout, redrawn at most every 2 s, and
    left in place when it ends."""

    def __init__(self, *args, **kwargs):
        if in_kernel():
            kwargs.setdefault("file", sys.stdout)
            kwargs.setdefault("mininterval", KERNEL_MININTERVAL)
            kwargs["leave"] = True
            kwargs["position"] = 0
        super().__init__(*args, **kwargs)


def _transformers_text_bar(factory, args, kwargs):
    """transformers' tqdm hook: our text bar, unless transformers' bars are turned off
    (then ``factory`` is its do-nothing bar, which we keep)."""
    from transformers.utils import logging as hf_logging

    return factory(*args, **kwargs) if factory is hf_logging.EmptyTqdm else tqdm(*args, **kwargs)


def quiet_library_progress() -> None:
    """Make the libraries' bars static text: transformers' bars plain text, datasets'
    and huggingface_hub's off inside a kernel. Safe to call more than once; a tqdm hook
    someone else installed in transformers is left in place."""
    # transformers reads huggingface_hub's on/off switch when its logging module is first
    # imported, so import it before turning the hub's bars off (or it turns off too).
    from transformers.utils import logging as hf_logging

    previous = hf_logging.set_tqdm_hook(_transformers_text_bar)
    if previous not in (None, _transformers_text_bar):
        hf_logging.set_tqdm_hook(previous)
    if in_kernel():
        from datasets.utils import disable_progress_bars as datasets_off
        from huggingface_hub.utils import disable_progress_bars as hub_off

        datasets_off()
        hub_off()


if in_kernel():
    quiet_library_progress()
