"""The quickstart notebook in a real JupyterLab, driven by headless Chromium: run all cells, see
the monitor and the dashboard's plotly figure render, change a control and see the figure follow.

The server runs on loopback with a test token and test-only config, data and settings folders
(news and update checks off); any request leaving the machine fails the test.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.ports import free_port

from .browser_support import ARGS, CHROMIUM, MARKS, is_local

ROOT = Path(__file__).resolve().parent.parent
#: Every host name but the loopback one fails to resolve in this browser.
BLOCK_DNS = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"
NOTEBOOK = "01_quickstart.ipynb"
STEPS = 16
NO_BASELINE = "no 1-rank run in this group: speedup needs a baseline; add world_size=1 to the sweep"
#: The dashboard's figure and its cell's output area, the run list's text against its box and
#: the height of the scaling table's first row.
WIDTHS = """() => {
    const plot = document.querySelector('.js-plotly-plot');
    const cell = plot.closest('.jp-OutputArea-output');
    const runs = [...document.querySelectorAll('.widget-select-multiple')]
        .find(w => w.querySelector('label')?.textContent === 'runs').querySelector('select');
    const row = cell.querySelector('table tbody tr');
    return {figure: plot.getBoundingClientRect().width, cell: cell.getBoundingClientRect().width,
            runs_scroll: runs.scrollWidth, runs_client: runs.clientWidth,
            table_row: row.getBoundingClientRect().height};
}"""

pytestmark = MARKS


def api(base: str, token: str, path: str, method: str = "GET") -> object:
    request = urllib.request.Request(
        f"{base}{path}", method=method, headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        body = response.read()
    return json.loads(body) if body else None


def wait_for_kernel(base: str, token: str, timeout_s: float = 120) -> None:
    """Until the notebook's kernel is started, idle and connected to the page."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            kernels = api(base, token, "/api/kernels") or []
        except urllib.error.HTTPError:  # jupyter_server answers 500 while a kernel starts
            kernels = []
        if any(k["execution_state"] == "idle" and k["connections"] > 0 for k in kernels):  # type: ignore[union-attr]
            return
        time.sleep(1)
    raise AssertionError(f"no kernel became idle and connected in {timeout_s} s: {kernels}")


def lab_environment(home: Path) -> dict[str, str]:
    """Environment for a JupyterLab that reads only test folders: news and update checks off."""
    dirs = {name: home / name for name in ("config", "data", "runtime", "settings", "workspaces")}
    for path in dirs.values():
        path.mkdir(parents=True)
    labconfig = dirs["config"] / "labconfig"
    labconfig.mkdir()
    # `jupyter labextension disable @jupyterlab/apputils-extension:announcements`, in the test's
    # own config folder: the plugin that would fetch the news feed never loads.
    disabled = {"@jupyterlab/apputils-extension:announcements": True}
    (labconfig / "page_config.json").write_text(json.dumps({"disabledExtensions": disabled}))
    settings = dirs["settings"] / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    # Lab 4 leaves cells out of view out of the DOM; the test looks at all of them.
    notebook = dirs["settings"] / "@jupyterlab" / "notebook-extension"
    notebook.mkdir(parents=True)
    (notebook / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    return {
        "JUPYTER_CONFIG_DIR": str(dirs["config"]),
        "JUPYTER_DATA_DIR": str(dirs["data"]),
        "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
        "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
        "IPYTHONDIR": str(home / "ipython"),
    }


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """A JupyterLab serving a folder holding the quickstart with small parameters baked in."""
    papermill = pytest.importorskip("papermill")
    home = tmp_path_factory.mktemp("lab")
    root, store = home / "root", home / "store"
    root.mkdir()
    papermill.execute_notebook(
        str(ROOT / "notebooks" / NOTEBOOK),
        str(root / NOTEBOOK),
        parameters={"output_dir": str(store), "max_steps": STEPS, "train_samples": 2048},
        prepare_only=True,  # parameters injected, nothing executed
    )
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, **lab_environment(home), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    log = open(home / "lab.log", "wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            "--ServerApp.open_browser=False",
            f"--ServerApp.root_dir={root}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",  # the pypi one would query PyPI
            *(["--ServerApp.allow_root=True"] if os.geteuid() == 0 else []),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                api(base, token, "/api/status")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail(
                        "JupyterLab did not start:\n" + (home / "lab.log").read_text()[-3000:]
                    )
                time.sleep(0.3)
        yield base, token, store
    finally:
        try:  # kernels first (they own the run's monitor), then the server, by its pid
            for kernel in api(base, token, "/api/kernels") or []:  # type: ignore[union-attr]
                api(base, token, f"/api/kernels/{kernel['id']}", method="DELETE")
        except OSError:
            pass
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.mark.timing
def test_quickstart_runs_and_its_dashboard_reacts(
    lab: tuple[str, str, Path], tmp_path: Path
) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    base, token, store = lab
    errors: list[str] = []
    outside: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[*ARGS, BLOCK_DNS])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            # Recorded here (no round trip per request, Lab loads hundreds of files); the
            # resolver rule in BLOCK_DNS makes sure nothing could leave anyway.
            page.on("request", lambda r: None if is_local(r.url) else outside.append(r.url))
            page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}", wait_until="load")
            # Generous limits: Lab's first load and a kernel start take long on a busy machine.
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=180_000)
            wait_for_kernel(base, token)
            page.wait_for_selector(
                ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000
            )
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            # Should the page not have bound its kernel yet, Lab asks which one: the default.
            dialog = page.locator(".jp-Dialog .jp-mod-accept")
            try:
                dialog.wait_for(timeout=2_000)
                dialog.click()
            except sync_api.TimeoutError:
                pass

            # The run ends (monitor.wait), then the dashboard draws its FigureWidget.
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=120_000)
            page.wait_for_function(
                "document.querySelector('.js-plotly-plot .gtitle')?.textContent"
                ".includes('Throughput per device')",
                timeout=30_000,
            )
            bars = page.locator(".widget-hprogress")
            assert bars.count() == 2  # the monitor's bar per rank
            assert page.locator(".widget-label", has_text=f"{STEPS} / {STEPS}").count() == 2
            assert page.get_by_text("status: completed").count() == 1
            assert page.get_by_text("'completed'").count() == 0  # monitor.wait() echoes nothing
            # One run of 2 ranks: the dashboard says what it lacks rather than a 100 % speedup.
            assert page.get_by_text(NO_BASELINE).count() == 1
            # The figure and the controls take the cell's width (plotly's default is 700 px).
            widths = page.evaluate(WIDTHS)
            assert widths["figure"] >= 0.9 * widths["cell"], widths
            assert widths["runs_scroll"] <= widths["runs_client"], widths  # names not cut off
            # one line per table row (a long note once wrapped a row to 250 px)
            assert widths["table_row"] < 60, widths

            figure = page.locator(".widget-dropdown", has=page.locator("label", has_text="figure"))
            figure.locator("select").select_option(label="speedup (with ideal)")
            page.wait_for_function(
                "document.querySelector('.js-plotly-plot .gtitle')?.textContent"
                ".startsWith('no 1-rank run')",
                timeout=30_000,
            )
            page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
        finally:
            # also on failure: the page as it was, in the test's own folder
            page.screenshot(path=str(tmp_path / "quickstart.png"), full_page=True)
            browser.close()
    assert errors == []
    assert outside == []
    assert (store / "quickstart").is_dir()
