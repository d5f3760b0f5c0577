"""JupyterLab on localhost as `make lab` starts it (the project's jupyter_config/ on
JUPYTER_CONFIG_PATH), with every per-user Jupyter folder in a temporary directory, on a
free port, stopped cleanly (its kernels first) when the block ends.

    with lab_server(root=REPO, home=tmp_path) as lab:
        model = lab.get("/api/contents/notebooks/01_filtering.py", type="notebook")
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT_CONFIG = REPO / "jupyter_config"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    def __init__(self, url: str, token: str, log: Path):
        self.url, self.token, self.log = url, token, log

    def request(self, method: str, path: str, body=None, timeout: float = 60, **query):
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"token {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as response:
            raw = response.read()
        kind = response.headers.get("Content-Type", "")
        return json.loads(raw) if raw and "json" in kind else raw.decode()

    def browser_url(self, path: str = "/lab") -> str:
        """A URL a browser can open (it logs in with the token), e.g. /lab/tree/notebooks/x.py"""
        return f"{self.url}{path}?token={self.token}"

    def get(self, path: str, **query):
        return self.request("GET", path, **query)

    def put(self, path: str, body):
        return self.request("PUT", path, body)


def isolated_env(home: Path) -> dict:
    """The user's own Jupyter folders replaced by empty ones under ``home``; JupyterLab's
    autosave off in them, so a test that runs a chapter in the browser leaves the
    checkout's notebook unchanged (it saves through the contents API when it means to)."""
    folders = {"JUPYTER_CONFIG_DIR": "config", "JUPYTER_DATA_DIR": "data",
               "JUPYTER_RUNTIME_DIR": "runtime", "JUPYTERLAB_SETTINGS_DIR": "lab-user-settings",
               "JUPYTERLAB_WORKSPACES_DIR": "lab-workspaces", "IPYTHONDIR": "ipython"}
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(PROJECT_CONFIG)}
    for name, folder in folders.items():
        (home / folder).mkdir(parents=True, exist_ok=True)
        env[name] = str(home / folder)
    docmanager = home / "lab-user-settings" / "@jupyterlab" / "docmanager-extension"
    docmanager.mkdir(parents=True, exist_ok=True)
    (docmanager / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    return env


def _wait_until_up(server: LabServer, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {process.returncode}:\n"
                               + server.log.read_text()[-3000:])
        try:
            server.get("/api/status", timeout=5)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    raise TimeoutError(f"JupyterLab not up after {timeout} s:\n" + server.log.read_text()[-3000:])


def _stop(server: LabServer, process: subprocess.Popen) -> None:
    with contextlib.suppress(Exception):  # kernels first, so none outlives the server
        for kernel in server.get("/api/kernels", timeout=10):
            server.request("DELETE", f"/api/kernels/{kernel['id']}", timeout=30)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@contextlib.contextmanager
def lab_server(root: Path, home: Path, timeout: float = 180, args: tuple[str, ...] = ()):
    """JupyterLab serving ``root`` with the project's settings; ``home`` holds its logs and
    the per-user folders; ``args``: more command-line options. Yields a ``LabServer``;
    stops it when the block ends."""
    home.mkdir(parents=True, exist_ok=True)
    port, token = free_port(), secrets.token_hex(16)
    log = home / "jupyterlab.log"
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               "--ServerApp.open_browser=False", "--allow-root",  # CI runs as root
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", *args]
    with open(log, "w") as log_file:
        process = subprocess.Popen(command, env=isolated_env(home), cwd=root, stdin=subprocess.DEVNULL,
                                   stdout=log_file, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # its own group: stoppable as one
    server = LabServer(f"http://127.0.0.1:{port}", token, log)
    try:
        _wait_until_up(server, process, timeout)
        yield server
    finally:
        _stop(server, process)
