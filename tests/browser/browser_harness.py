"""Headless Debian chromium for the real-browser tests, with the network cut off.

    with headless_chromium(tmp_path) as (context, guard):
        page = context.new_page()
        page.goto(path.as_uri())
        ...
    guard.assert_nothing_left()

playwright drives the system chromium (``RLPROBE_CHROMIUM``, else /usr/lib/chromium/chromium,
else /usr/bin/chromium); its own browser download cannot reach the internet here. Every
browser starts with a fresh user-data-dir and flags that stop its own background traffic,
a dead proxy for anything that is not loopback, and a route that aborts any request that is
not file:, data:, blob:, about: or to localhost, recording every request the page made.
Reusable by any page test (a generated page, an exported notebook, JupyterLab on localhost).
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest

CANDIDATES = ["/usr/lib/chromium/chromium", "/usr/bin/chromium"]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--proxy-server=http://127.0.0.1:9"]  # loopback bypasses the proxy; the rest dies there
LOCAL_HOSTS = {"localhost", "127.0.0.1", "[::1]", "::1"}
LOCAL_SCHEMES = {"file", "data", "blob", "about"}


def chromium_path() -> str | None:
    found = [os.environ.get("RLPROBE_CHROMIUM")] + CANDIDATES + [shutil.which("chromium")]
    return next((p for p in found if p and Path(p).is_file() and os.access(p, os.X_OK)), None)


def require_browser() -> str:
    """The chromium binary, or skip (fail under CI, where scripts/ensure_browser.sh installs it)."""
    path = chromium_path()
    missing = None
    if path is None:
        missing = "no chromium found: run scripts/ensure_browser.sh (Debian: apt-get install chromium)"
    else:
        if importlib.util.find_spec("playwright") is None:
            missing = "playwright is not installed (it comes with the test extras: make install)"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    return path


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in LOCAL_SCHEMES or (parts.scheme in {"http", "https", "ws", "wss"}
                                             and parts.hostname in LOCAL_HOSTS)


class NetworkGuard:
    """Records every request of the pages it watches and aborts the non-local ones."""

    def __init__(self):
        self.requests: list[str] = []
        self.blocked: list[str] = []

    def attach(self, context) -> None:
        context.on("request", lambda request: self.requests.append(request.url))
        context.route("**/*", self._route)

    def _route(self, route) -> None:
        if is_local(route.request.url):
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort("blockedbyclient")

    def non_local(self) -> list[str]:
        return sorted({u for u in self.requests + self.blocked if not is_local(u)})

    def assert_nothing_left(self) -> None:
        assert self.non_local() == [], f"the page tried to reach the network: {self.non_local()}"


@contextlib.contextmanager
def headless_chromium(tmp_path: Path, width: int = 1200, height: int = 900):
    """A fresh headless chromium (its own user-data-dir under ``tmp_path``) and its guard."""
    from playwright.sync_api import sync_playwright

    binary = require_browser()
    profile = tmp_path / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    guard = NetworkGuard()
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=binary, headless=True, args=FLAGS,
            viewport={"width": width, "height": height}, service_workers="block")
        try:
            guard.attach(context)
            yield context, guard
        finally:
            context.close()


def pixel_spread(context, png: bytes) -> dict:
    """Mean and standard deviation of a PNG's grey levels, measured by the browser itself in
    a blank page (no image library needed): a blank screenshot has a spread near 0."""
    page = context.new_page()
    try:
        return page.evaluate("""async (b64) => {
            const img = new Image();
            img.src = 'data:image/png;base64,' + b64;
            await img.decode();
            const c = document.createElement('canvas');
            c.width = img.width; c.height = img.height;
            const g = c.getContext('2d');
            g.drawImage(img, 0, 0);
            const d = g.getImageData(0, 0, c.width, c.height).data;
            let n = 0, s = 0, s2 = 0;
            for (let i = 0; i < d.length; i += 4) {
                const y = 0.299 * d[i] + 0.587 * d[i + 1] + 0.114 * d[i + 2];
                n += 1; s += y; s2 += y * y;
            }
            const mean = s / n;
            return {width: c.width, height: c.height, mean: mean, std: Math.sqrt(s2 / n - mean * mean)};
        }""", base64.b64encode(png).decode())
    finally:
        page.close()


def pixel_change(context, png_a: bytes, png_b: bytes) -> float:
    """Mean absolute difference of two same-sized PNGs' grey levels (0..255), measured by
    the browser in a blank page."""
    page = context.new_page()
    try:
        return page.evaluate("""async ([a, b]) => {
            const grey = async (b64) => {
                const img = new Image();
                img.src = 'data:image/png;base64,' + b64;
                await img.decode();
                const c = document.createElement('canvas');
                c.width = img.width; c.height = img.height;
                const g = c.getContext('2d');
                g.drawImage(img, 0, 0);
                return g.getImageData(0, 0, c.width, c.height).data;
            };
            const [x, y] = [await grey(a), await grey(b)];
            let s = 0;
            for (let i = 0; i < x.length; i += 4) {
                s += Math.abs((0.299 * x[i] + 0.587 * x[i + 1] + 0.114 * x[i + 2])
                            - (0.299 * y[i] + 0.587 * y[i + 1] + 0.114 * y[i + 2]));
            }
            return s / (x.length / 4);
        }""", [base64.b64encode(png_a).decode(), base64.b64encode(png_b).decode()])
    finally:
        page.close()


def tooltip_visible(page, locator) -> bool:
    """Hover ``locator``: the page runtime's tooltip box shows, fully inside the window, and
    the pixels where it is change (it is drawn, not clipped by a scrolling ancestor)."""
    locator.scroll_into_view_if_needed()
    page.wait_for_timeout(250)  # scrolling hides a tooltip: let its events pass first
    page.mouse.move(0, 0)
    box = locator.bounding_box()
    page.mouse.move(box["x"] + min(4, box["width"] / 2), box["y"] + box["height"] / 2)
    rect = page.evaluate("""() => { const b = document.querySelector('.rp-tipbox');
        if (!b || b.style.display === 'none') return null;
        const r = b.getBoundingClientRect();
        return {x: r.left, y: r.top, width: r.width, height: r.height,
                inside: r.left >= 0 && r.top >= 0 && r.right <= innerWidth && r.bottom <= innerHeight}; }""")
    if not rect or not rect["inside"]:
        return False
    clip = {k: rect[k] for k in ("x", "y", "width", "height")}
    shown = page.screenshot(clip=clip)
    page.mouse.move(0, 0)  # the tooltip goes: the same place without it
    gone = page.screenshot(clip=clip)
    page.mouse.move(box["x"] + min(4, box["width"] / 2), box["y"] + box["height"] / 2)
    return pixel_change(page.context, gone, shown) > 8
