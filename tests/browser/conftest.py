"""Real-browser tests: select them with `pytest -m browser`, leave them out with
`-m "not browser"`. They need Debian's chromium (scripts/ensure_browser.sh installs it)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: real-browser tests (headless Debian chromium, no network)")
