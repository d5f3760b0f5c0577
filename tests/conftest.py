"""Shared fixtures, and how the session's work is shared out.

``small_book``: the whole book, run once per test session exactly as `make demo` runs it
(python -m rlprobe_nb.book), on the demo suite shrunk to four checkpoints and a handful of
problems, into a temporary results folder; the end-to-end tests read what a user reads
from it (executed notebooks, HTML pages, tables). It is built in the background from the
session's start, once for all xdist workers (``session_book``), and read-only to its readers.

Under pytest-xdist (`make test` runs two workers), each worker gets an equal share of the
cores for torch's CPU threads (two workers each spinning two threads on two cores run
slower than one), passed on to the notebooks' kernels through OMP_NUM_THREADS; tests are
handed out a module at a time (``--dist loadfile`` in pyproject.toml), so a module's
fixtures are built once and its tests that change shared files run one after another.
"""

import os
import signal
import warnings

import pytest
import session_book
import torch
from tiny_models import tiny_llama


def pytest_configure(config):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if os.environ.get("PYTEST_XDIST_WORKER") and workers > 1:
        threads = str(max(1, len(os.sched_getaffinity(0)) // workers))
        os.environ.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        torch.set_num_threads(int(threads))


def pytest_collection_modifyitems(config, items):
    """Modules that read the small book run after the others, so that its build (started
    with the session) is done or nearly when they start. Otherwise the collected order."""
    readers = {item.path for item in items if "small_book" in item.fixturenames}
    items.sort(key=lambda item: item.path in readers)  # stable: a module stays together


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``tiny_llama`` saved to a folder, so fresh processes can load it: (folder, model, tok)."""
    model, tok = tiny_llama()
    folder = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, model, tok


@pytest.fixture(scope="session", autouse=True)
def small_book_build(request, tmp_path_factory):
    """Starts the small book's build when the session starts, if a collected test reads
    it (in one worker only: the first to claim it); at the end, waits for it to finish."""
    book = session_book.layout(session_book.session_folder(tmp_path_factory))
    wanted = any("small_book" in item.fixturenames for item in request.session.items)
    build = session_book.start(book) if wanted else None
    yield book
    if build is not None:
        build.finish(interrupted=bool(request.session.shouldstop or request.session.shouldfail))


@pytest.fixture(scope="session")
def small_book(small_book_build):
    """The built book: {"env", "out", "data", "figures", "log"}. Fails the session at its
    end if a reader wrote into it."""
    book = dict(small_book_build)
    built = session_book.wait(book)
    assert built["status"] == 0, book["log"][-4000:]
    yield book
    changed = session_book.changed_files(book, built["files"])
    assert not changed, f"a test wrote into the shared small book: {changed[:10]}"


@pytest.fixture(autouse=True)
def sigint_as_it_was(request):
    """Ctrl-C's handler after every test as before it. A library that starts worker
    processes can leave SIGINT ignored in the test process (its children then inherit
    the ignored signal): the Ctrl-C tests of the book would then wait for a signal that
    never arrives. Restored, and named, so the leak is seen rather than inherited."""
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        warnings.warn(f"{request.node.nodeid} left SIGINT's handler changed ({before!r} -> "
                      f"{after!r}); restored")
