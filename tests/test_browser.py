"""The live panel, the turn cards and ``%chat explore`` as a person sees them: real
JupyterLab 4 and Notebook 7 in headless Chromium (Debian's ``chromium`` +
``chromium-driver``, driven by Selenium), in the light and the dark theme.

``test_panel_and_turn_cards_in_jupyterlab`` (JupyterLab, light): a notebook runs a session
against the emulator behind a 32 KB body limit with 2 s of latency (a slow summary). The
DOM must show the step tracker lighting the summary step during the 413 recovery, the
request bar going over the learned cap and coming back, the counts while it runs, and the
Cancel button cancelling a slow summary with the history unchanged. Then the notebook is
saved and reopened with a new kernel: the turn cards read as they did, and the panel's
place shows its snapshot, never a widget error.

The explorer tests run once per front end and theme (the ``front`` fixture: JupyterLab 4 or
Notebook 7, the theme set through ``JUPYTERLAB_SETTINGS_DIR``), on one notebook, in order:
each control moved changes the plan; Replay shows its table and its plot as an image of
nonzero size; every text element of our outputs reads at 4.5:1 or more against its
effective background (``tests/contrast.py``); Apply, then "Undo apply", gives the session
back its settings (``%chat config`` in a later cell reads as before); saved, the kernel
shut down and reopened with no widget state, the panel's snapshot, the turn card and the
explorer's snapshot read (its plot too), none "Error displaying widget".

Screenshots go to a temporary directory (``IPY_CTXRECOVERY_SCREENSHOTS`` names another),
one set per front end and theme (``-nb7``, ``-dark`` in the name); to refresh the ones the
README shows, run it with ``IPY_CTXRECOVERY_SCREENSHOTS=docs`` (a test run leaves the working
tree as it was).

Locally the tests skip with one line when Chromium, its driver, Selenium, JupyterLab or
Notebook 7 is missing; under ``CI=true`` they fail instead (``.ci/run`` installs them).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
SHOTS = Path(os.environ.get("IPY_CTXRECOVERY_SCREENSHOTS")
             or tempfile.mkdtemp(prefix="ipy_ctxrecovery-shots-"))
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
START_TIMEOUT = 60.0
STEP_TIMEOUT = 90.0
LOREM = ("The quick brown fox jumps over the lazy dog while the proxy counts every byte "
         "of the request body. ")

PRIME = (
    "from ipy_ctxrecovery.notebook import get_magics\n"
    "for i in range({n}):\n"
    "    get_ipython().run_cell_magic('chat', '', f'part {{i}}: ' + {lorem!r} * 95)\n"
    "history_before = len(get_magics().workspace.session().history)\n"
    "print('primed', history_before)"
)

CELLS = [
    ("code", "%load_ext ipy_ctxrecovery\n"
             "%chat emulator --max-body 32KB --context-window 200000 --latency 2"),
    ("code", "%chat panel"),
    ("code", PRIME.format(n=3, lorem=LOREM)),
    ("code", "%%chat\nCompare the three parts with this one: " + LOREM * 40),
    ("code", PRIME.format(n=1, lorem=LOREM)),
    ("code", "%%chat\nAnd the fourth part: " + LOREM * 60),
    ("code", "print('history unchanged:', "
             "len(get_magics().workspace.session().history) == history_before)"),
    ("code", "%chat explore"),
]


def _missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    for module in ("selenium", "jupyterlab", "notebook"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install -e '.[browser]')"
    return None


@pytest.fixture(scope="module")
def browser_ready() -> None:
    reason = _missing()
    if reason is None:
        return
    reason = f"browser test: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}, and CI=true requires it.")
    print(f"SKIP: {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _notebook(cells: list[tuple[str, str]]) -> dict[str, Any]:
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}},
            "cells": [{"cell_type": kind, "id": f"cell-{i}", "metadata": {},
                       "source": source, "outputs": [], "execution_count": None}
                      for i, (kind, source) in enumerate(cells)]}


#: The plugin settings every server starts with: no windowing (every cell in the DOM), no
#: news prompt, widget state not saved (the default; our outputs must stand on their own).
SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
    "@jupyter-widgets/jupyterlab-manager/plugin": {"saveState": False},
}
#: The theme's setting: JupyterLab 4 and Notebook 7 both read it from JUPYTERLAB_SETTINGS_DIR
#: (Notebook 7's server is a LabServerApp with the same user settings dir).
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}
#: What each front end runs as and where it opens a notebook.
FRONT_ENDS = {"lab": ("lab", "/lab/tree/"), "notebook": ("notebook", "/notebooks/")}


@contextlib.contextmanager
def serve(base: Path, notebooks: dict[str, list[tuple[str, str]]], *, front_end: str = "lab",
          theme: str = "light") -> Iterator[dict[str, Any]]:
    """JupyterLab 4 or Notebook 7 on 127.0.0.1 with a temp root, config, settings (the
    theme among them) and a random token; stopped by its PID."""
    root = base / "root"
    root.mkdir()
    for name, cells in notebooks.items():
        (root / name).write_text(json.dumps(_notebook(cells)))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "IPY_CTXRECOVERY_DIR": str(base / "state"),
        "JUPYTER_CONFIG_DIR": str(base / "config"),
        "JUPYTERLAB_SETTINGS_DIR": str(base / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
    })
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "CHATCLI_MAX_PAYLOAD",
                "CHATCLI_CONTEXT_WINDOW"):
        env.pop(var, None)
    settings = base / "settings"
    for plugin, values in {**SETTINGS, "@jupyterlab/apputils-extension/themes":
                           {"theme": THEMES[theme]}}.items():
        folder, name = plugin.rsplit("/", 1)
        (settings / folder).mkdir(parents=True, exist_ok=True)
        (settings / folder / f"{name}.jupyterlab-settings").write_text(json.dumps(values))
    app, prefix = FRONT_ENDS[front_end]
    log = (base / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", app, "--no-browser", "--ServerApp.ip=127.0.0.1",
         *(["--allow-root"] if os.geteuid() == 0 else []),
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         *(["--LabApp.news_url=", "--LabApp.extension_manager=readonly",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
           if front_end == "lab" else [])],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                    break
            except OSError as e:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"jupyter {app} did not start: "
                                       + (base / "server.log").read_text(errors="replace")
                                       [-2000:]) from e
                time.sleep(0.25)
        yield {"url": url, "token": token, "root": root, "log": base / "server.log",
               "profile": base / "chromium", "front_end": front_end, "theme": theme,
               "prefix": prefix}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log.close()


@pytest.fixture
def lab(browser_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """JupyterLab 4, light theme, with the recovery notebook (``panel.ipynb``); one test
    uses it, so it stops when that test ends, before the explorer's servers start."""
    with serve(tmp_path_factory.mktemp("lab"), {"panel.ipynb": CELLS}) as server:
        yield server


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[Any]:
    """Headless Chromium driven by Selenium, with its own profile; quit at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1100,1000",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    browser.set_script_timeout(30)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def driver(lab: dict[str, Any]) -> Iterator[Any]:
    with chromium(lab["profile"]) as browser:
        yield browser


# -- helpers ------------------------------------------------------------------------------

def wait_for(predicate: Callable[[], Any], what: str, timeout: float = STEP_TIMEOUT,
             every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def open_notebook(driver: Any, lab: dict[str, Any], name: str = "panel.ipynb") -> None:
    """Open ``name`` in the server's front end; wait for its cells, its kernel idle (as the
    server reports it: JupyterLab and Notebook 7 show it in different places) and the theme
    the server was given."""
    driver.get(f"{lab['url']}{lab['prefix']}{name}?token={lab['token']}")
    wait_for(lambda: driver.execute_script(
        "return document.querySelectorAll('.jp-Notebook .jp-Cell').length > 0")
        and _kernel_state(lab, name) == "idle", "the notebook and an idle kernel")
    light = "false" if lab.get("theme") == "dark" else "true"
    wait_for(lambda: driver.execute_script(
        "return document.body.dataset.jpThemeLight") == light, f"the {lab.get('theme')} theme")
    if driver.find_elements("css selector", ".jp-SideBar.jp-mod-left .lm-mod-current"):
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        # The file browser closed: the notebook gets the width a person would give it.
        ActionChains(driver).key_down(Keys.CONTROL).send_keys("b").key_up(Keys.CONTROL).perform()
    time.sleep(1.0)   # the kernel's connection settles (a cell sent earlier can be dropped)


def _kernel_state(lab: dict[str, Any], name: str) -> str | None:
    for session in _sessions(lab):
        if session.get("path", "").endswith(name):
            return str(session["kernel"].get("execution_state"))
    return None


def _sessions(lab: dict[str, Any]) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{lab['url']}/api/sessions?token={lab['token']}") as r:
        return list(json.loads(r.read()))


def save_and_shut_down(driver: Any, lab: dict[str, Any], name: str,
                       saved: Callable[[list[list[dict[str, Any]]]], bool]) -> list[
                           list[dict[str, Any]]]:
    """Save the notebook (Ctrl+S) until its file's outputs satisfy ``saved``, then shut its
    kernel down (the session deleted), so that it opens again with a new kernel and no widget
    state. Returns the saved outputs, cell by cell."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    path = lab["root"] / name

    def outputs() -> list[list[dict[str, Any]]] | None:
        try:
            nb = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        found = [c.get("outputs", []) for c in nb["cells"]]
        return found if saved(found) else None

    def save() -> list[list[dict[str, Any]]] | None:
        ActionChains(driver).key_down(Keys.CONTROL).send_keys("s").key_up(Keys.CONTROL).perform()
        return _try(lambda: wait_for(outputs, "the notebook to be saved", timeout=5))

    result = wait_for(save, "the notebook saved", timeout=STEP_TIMEOUT, every=1)
    driver.execute_script("window.onbeforeunload = null;")
    for session in _sessions(lab):   # a new kernel when the notebook opens again
        request = urllib.request.Request(
            f"{lab['url']}/api/sessions/{session['id']}?token={lab['token']}", method="DELETE")
        urllib.request.urlopen(request).close()
    return list(result)


def _try(fn: Callable[[], Any]) -> Any:
    """``fn()``, or None where it times out (a save the page did not take yet)."""
    try:
        return fn()
    except AssertionError:
        return None


def run_cell(driver: Any, index: int) -> None:
    """Focus cell ``index`` and run it (Shift+Enter)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    def clicked() -> bool:
        cells = driver.find_elements("css selector", ".jp-Notebook .jp-Cell")
        editor = cells[index].find_element("css selector", ".cm-content")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", editor)
        try:
            editor.click()
        except WebDriverException:
            return False
        return True

    wait_for(clicked, f"cell {index} to take the focus", timeout=30)
    ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()


def cell_done(driver: Any, index: int) -> bool:
    """The cell ran: its prompt shows an execution count (not "*", not empty)."""
    return bool(driver.execute_script(
        "const c = document.querySelectorAll('.jp-Notebook .jp-Cell')[arguments[0]];"
        "const p = c.querySelector('.jp-InputPrompt').textContent;"
        "return /\\[\\d+\\]/.test(p);", index))


def cell_started(driver: Any, index: int) -> bool:
    return bool(driver.execute_script(
        "const c = document.querySelectorAll('.jp-Notebook .jp-Cell')[arguments[0]];"
        "return /\\[(\\*|\\d+)\\]/.test(c.querySelector('.jp-InputPrompt').textContent);",
        index))


def start_cell(driver: Any, index: int) -> None:
    """Run cell ``index`` and wait until the kernel took it (once more if it was dropped,
    as a request sent while the kernel still connects can be)."""
    for _ in range(3):
        run_cell(driver, index)
        try:
            wait_for(lambda: cell_started(driver, index), f"cell {index} to start", timeout=10)
            return
        except AssertionError:
            continue
    raise AssertionError(f"cell {index} never started")


def run_and_wait(driver: Any, index: int) -> None:
    start_cell(driver, index)
    wait_for(lambda: cell_done(driver, index), f"cell {index} to finish")


def outputs_text(driver: Any, index: int) -> str:
    """The cell's outputs as a person reads them (whitespace runs, table tabs, as one space)."""
    return " ".join(str(driver.execute_script(
        "const c = document.querySelectorAll('.jp-Notebook .jp-Cell')[arguments[0]];"
        "return c.querySelector('.jp-Cell-outputArea')?.innerText || '';", index)).split())


WATCH = r"""
window.__ctxr = [];
const snap = () => {
  const p = document.querySelector('.ctxr-panel[data-live="yes"]');
  if (!p) return null;
  const steps = {};
  p.querySelectorAll('.ctxr-step').forEach(s => {
    steps[s.dataset.stage] = s.className.replace('ctxr-step', '').trim(); });
  const act = document.querySelector('.ctxr-activity');
  const cancel = document.querySelector('.ctxr-cancel');
  return JSON.stringify({
    steps,
    size: p.querySelector('.ctxr-size').dataset.fraction,
    sizeLabel: p.querySelector('.ctxr-size .ctxr-label').textContent,
    over: !!p.querySelector('.ctxr-size .ctxr-fill.over'),
    counts: p.querySelector('.ctxr-counts').textContent,
    activity: act && act.style.display !== 'none'
      ? act.querySelector('.ctxr-activity-label').textContent : '',
    cancel: !!(cancel && cancel.style.display !== 'none'),
    levels: Array.from(p.querySelectorAll('.ctxr-level.lit')).map(l => l.textContent),
  });
};
let last = null;
new MutationObserver(() => {
  const s = snap();
  if (s && s !== last) { last = s; window.__ctxr.push(JSON.parse(s)); }
}).observe(document.body, {subtree: true, childList: true, characterData: true,
                          attributes: true});
"""


def states(driver: Any) -> list[dict[str, Any]]:
    return list(driver.execute_script("return window.__ctxr || [];"))


def shoot(driver: Any, element: Any, name: str) -> None:
    """A screenshot of ``element``, whole: the window grows for one taller than it (else the
    status bar covers its foot)."""
    SHOTS.mkdir(exist_ok=True)
    size = driver.get_window_size()
    height = driver.execute_script("return arguments[0].getBoundingClientRect().height",
                                   element)
    taller = height + 250 > size["height"]
    if taller:
        driver.set_window_size(size["width"], int(height) + 400)
        time.sleep(0.5)
    try:
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", element)
        element.screenshot(str(SHOTS / name))
    finally:
        if taller:
            driver.set_window_size(size["width"], size["height"])


# -- the test ---------------------------------------------------------------------------------

def test_panel_and_turn_cards_in_jupyterlab(lab: dict[str, Any], driver: Any) -> None:
    try:
        _run_the_notebook(lab, driver)
    except BaseException:
        shot = lab["profile"].parent / "failure.png"
        driver.save_screenshot(str(shot))
        print(f"screenshot of the failure: {shot}; JupyterLab's log: {lab['log']}")
        raise


def _run_the_notebook(lab: dict[str, Any], driver: Any) -> None:
    open_notebook(driver, lab)
    run_and_wait(driver, 0)
    assert "emulator restarted" in outputs_text(driver, 0)
    run_and_wait(driver, 1)
    panel = wait_for(lambda: driver.find_elements("css selector", ".ctxr-panel"), "the panel")
    assert panel[0].get_attribute("data-live") == "no"          # a snapshot between turns
    assert "live panel · session default" in panel[0].text
    assert "no payload cap known" in panel[0].text               # said, not a near-empty bar
    assert driver.find_elements("css selector", ".ctxr-size .ctxr-track.none")
    run_and_wait(driver, 2)
    assert "primed" in outputs_text(driver, 2)

    # The 413 recovery: watched through every DOM change of the live panel.
    driver.execute_script(WATCH)
    start_cell(driver, 3)
    summarizing = wait_for(lambda: driver.find_elements(
        "css selector", ".ctxr-step.running[data-stage='summarize']"), "the summary step lit")
    time.sleep(0.8)   # the elapsed time ticks in the screenshot
    live = driver.find_element("css selector", ".ctxr-panel[data-live='yes']")
    shoot(driver, live.find_element(
        "xpath", "./ancestor::div[contains(@class,'jp-OutputArea-output')]"), "panel.png")
    assert summarizing
    wait_for(lambda: cell_done(driver, 3), "the recovery turn to finish")
    seen = states(driver)
    lit = [s for s in seen if s["steps"].get("summarize") == "running"]
    assert lit, seen
    assert all(s["activity"] == "the model is summarizing older messages" and s["cancel"]
               for s in lit)
    assert all("a compaction running" in s["counts"] and "0 compactions" not in s["counts"]
               .split("·")[-1] for s in lit)
    assert any(s["levels"] == ["summarize to fit"] for s in lit)
    over = [i for i, s in enumerate(seen) if s["over"]]
    assert over, "the request bar never went over the learned cap"
    assert any(not s["over"] and float(s["size"] or 0) < 1 for s in seen[over[-1]:]), \
        "the request bar did not come back under the cap"
    assert seen[-1]["steps"]["send"] == "done"
    card = outputs_text(driver, 3)
    assert "✓ answered after 1 recovery step" in card
    assert "recovery 1: summarize to fit" in card and "payload too large (413)" in card
    assert "✗ send" in card and "✓ send" in card and "(try 2) · answered" in card
    panel_text = driver.find_element("css selector", ".ctxr-panel").text
    assert "so far: 1 recovery, 1 compaction" in panel_text
    narrow_column(driver)
    assert "last turn: ✓ answered after 1 recovery step" in panel_text
    assert "(learned)" in panel_text

    # Cancel during a slow summary: the same path as an interrupt, history unchanged.
    run_and_wait(driver, 4)
    start_cell(driver, 5)
    button = wait_for(lambda: [b for b in driver.find_elements("css selector", ".ctxr-cancel")
                               if b.is_displayed()], "the Cancel button")[0]
    button.click()
    wait_for(lambda: cell_done(driver, 5), "the cancelled turn to end")
    cancelled = outputs_text(driver, 5)
    assert "✗ cancelled · history exactly as before" in cancelled
    assert "KeyboardInterrupt" in cancelled
    run_and_wait(driver, 6)
    assert "history unchanged: True" in outputs_text(driver, 6)
    panel_text = driver.find_element("css selector", ".ctxr-panel").text
    assert "last turn: ✗ cancelled · history exactly as before" in panel_text
    run_and_wait(driver, 7)
    narrow_explorer(driver)
    shoot(driver, driver.find_elements("css selector", ".jp-Notebook .jp-Cell")[1]
          .find_element("css selector", ".jp-Cell-outputArea"), "panel-idle.png")

    # Save, then reopen with a new kernel.
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    ActionChains(driver).key_down(Keys.CONTROL).send_keys("s").key_up(Keys.CONTROL).perform()
    path = lab["root"] / "panel.ipynb"
    saved = wait_for(lambda: _saved_outputs(path), "the notebook to be saved")
    widget = "application/vnd.jupyter.widget-view+json"
    assert all(widget not in o.get("data", {}) for o in saved[1])   # the panel: a snapshot
    assert any("text/html" in o.get("data", {}) for o in saved[1])
    driver.execute_script("window.onbeforeunload = null;")
    sessions = json.loads(urllib.request.urlopen(
        f"{lab['url']}/api/sessions?token={lab['token']}").read())
    for session in sessions:   # a new kernel when the notebook opens again
        request = urllib.request.Request(
            f"{lab['url']}/api/sessions/{session['id']}?token={lab['token']}", method="DELETE")
        urllib.request.urlopen(request).close()
    open_notebook(driver, lab)
    page = driver.find_element("css selector", ".jp-Notebook").text
    assert "Error displaying widget" not in page and "model not found" not in page
    card = outputs_text(driver, 3)
    assert "✓ answered after 1 recovery step" in card
    assert "recovery 1: summarize to fit" in card
    assert "✗ cancelled · history exactly as before" in outputs_text(driver, 5)
    snapshot = outputs_text(driver, 1)
    assert "live panel · session default" in snapshot and "idle · as of" in snapshot
    cell = driver.find_elements("css selector", ".jp-Notebook .jp-Cell")[3]
    shoot(driver, cell.find_element("css selector", ".ctxr-card"), "turn-card.png")


def narrow_column(driver: Any) -> None:
    """In a narrow window the panel wraps inside its column: nothing runs past the right
    edge, the two bars start at the same x, the title is cut with an ellipsis."""
    size = driver.get_window_size()
    driver.set_window_size(560, size["height"])
    try:
        panel = driver.find_element("css selector", ".ctxr-panel")
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", panel)
        time.sleep(0.3)
        layout = driver.execute_script(
            "const p = arguments[0];"
            "const out = p.closest('.jp-OutputArea-output');"
            "const tracks = Array.from(p.querySelectorAll('.ctxr-track'))"
            "  .map(t => Math.round(t.getBoundingClientRect().left));"
            "const title = p.querySelector('.ctxr-title');"
            "return {over: Array.from(p.querySelectorAll('*')).filter(e =>"
            "  e.getBoundingClientRect().right > out.getBoundingClientRect().right + 1).length,"
            "  tracks, ellipsis: getComputedStyle(title).textOverflow};", panel)
        assert layout["over"] == 0, layout
        assert len(set(layout["tracks"])) == 1, layout
        assert layout["ellipsis"] == "ellipsis"
        shoot(driver, panel.find_element("xpath", "./ancestor::div[contains(@class,"
                                                  "'jp-OutputArea-output')]"),
              "panel-narrow.png")
    finally:
        driver.set_window_size(size["width"], size["height"])


EXPLORER_LAYOUT = """
const root = arguments[0];
const edge = root.closest('.jp-OutputArea-output').getBoundingClientRect().right;
return {
  over: Array.from(root.querySelectorAll('*')).filter(e => {
      const r = e.getBoundingClientRect(); return r.width > 0 && r.right > edge + 1; })
    .map(e => e.className + ': ' + (e.innerText || '').slice(0, 30)),
  clipped: Array.from(root.querySelectorAll('button, .widget-label, input'))
    .filter(e => e.scrollWidth > e.clientWidth + 1)
    .map(e => e.innerText || e.value || e.className)};
"""


def narrow_explorer(driver: Any) -> None:
    """In a narrow window the %chat explore widget wraps its columns and buttons: nothing
    runs past the output's right edge, no button, label or field is cut."""
    size = driver.get_window_size()
    driver.set_window_size(560, size["height"])
    try:
        cell = driver.find_elements("css selector", ".jp-Notebook .jp-Cell")[7]
        root = wait_for(lambda: cell.find_elements("css selector", ".widget-vbox"),
                        "the explore widget")[0]
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", root)
        time.sleep(0.5)
        layout = driver.execute_script(EXPLORER_LAYOUT, root)
        assert layout == {"over": [], "clipped": []}, layout
        shoot(driver, root, "explore-narrow.png")
    finally:
        driver.set_window_size(size["width"], size["height"])


def _saved_outputs(path: Path) -> list[list[dict[str, Any]]] | None:
    try:
        nb = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    outputs = [c.get("outputs", []) for c in nb["cells"]]
    return outputs if len(outputs) > 5 and outputs[5] else None


# -- the explorer, in both front ends and both themes ----------------------------------------

#: Without matplotlib (CI has none) the kernel draws the replay's plot itself: bars of the
#: same histories, a real PNG, so the path from the kernel to the <img> is what is tested.
STAND_IN_PLOT = r"""
import importlib.util, struct, zlib
from ipy_ctxrecovery.session.replay import ReplayPlot
if importlib.util.find_spec("matplotlib") is None:
    def _bars_png(self, width=480, height=140):
        sizes = [t.history_bytes for r in self.report.runs for t in r.turns] or [0]
        top, bar = max(sizes) or 1, max(3, width // len(sizes))
        rows = b"".join(b"\0" + b"".join(
            b"\x15\x65\xc0" if x // bar < len(sizes) and x % bar < bar - 2
            and height - y <= sizes[x // bar] * (height - 6) / top else b"\xf5\xf5\xf5"
            for x in range(width)) for y in range(height))
        def chunk(kind, data):
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data)))
        return (b"\x89PNG\r\n\x1a\n"
                + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    ReplayPlot.png = _bars_png
    print("no matplotlib: the replay's plot is drawn as plain bars of the same histories")
"""

EXPLORE_NB = "explore.ipynb"
EXPLORE_CELLS = [
    ("code", "%load_ext ipy_ctxrecovery\n"
             "%chat emulator --max-body 32KB --context-window 200000\n" + STAND_IN_PLOT),
    ("code", "%chat panel"),
    ("code", PRIME.format(n=3, lorem=LOREM)),
    ("code", "%%chat\nCompare the three parts with this one: " + LOREM * 40),  # a 413: a card
    ("code", "%chat config"),
    ("code", "%chat explore"),
    ("code", "%chat config"),           # after Apply and its undo: as before
]
PANEL_CELL, CARD_CELL, CONFIG_BEFORE, EXPLORE_CELL, CONFIG_AFTER = 1, 3, 4, 5, 6
WIDGET = "application/vnd.jupyter.widget-view+json"

#: Each explorer control, the value a person types or drags it to, and the line of the plan
#: the plan's "changed:" line must name (None: the plan's "next message:" line changes).
CONTROLS: list[tuple[str, str, str, str | None]] = [
    ("next message", "text", "20KB", None),
    ("payload cap", "text", "16KB", "max_payload"),
    ("context window", "text", "100000", "context_window"),
    ("per-result budget", "text", "5000", "per_result_max_chars"),
    ("per-turn budget", "text", "50000", "turn_budget_chars"),
    ("truncate results after", "slider", "1", "microcompact_truncate_turns"),
    ("one-line results after", "slider", "6", "microcompact_summarize_turns"),
    ("emergency keep", "slider", "4", "emergency_keep_messages"),
    ("chat budget (window)", "slider", "0.5", "chat_budget_ratio"),
    ("chat budget (cap)", "slider", "0.5", "cap_budget_fraction"),
    ("jump past (of cap)", "slider", "0.6", "preflight_cap_fraction"),
    ("jump budget (window)", "slider", "0.3", "preflight_budget_ratio"),
]


@pytest.fixture(scope="module", params=[("lab", "light"), ("lab", "dark"),
                                        ("notebook", "light"), ("notebook", "dark")],
                ids=["lab-light", "lab-dark", "notebook7-light", "notebook7-dark"])
def front(request: pytest.FixtureRequest, browser_ready: None,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server (JupyterLab 4 or Notebook 7, light or dark) and Chromium on the explore
    notebook, run up to its ``%chat explore`` cell. The tests below share it, in order:
    they move the controls, replay, check contrast, apply and undo, then save and reload."""
    front_end, theme = request.param
    with serve(tmp_path_factory.mktemp(f"{front_end}-{theme}"), {EXPLORE_NB: EXPLORE_CELLS},
               front_end=front_end, theme=theme) as server, \
            chromium(server["profile"]) as browser:
        server["driver"] = browser
        server["suffix"] = ("" if front_end == "lab" else "-nb7") \
            + ("-dark" if theme == "dark" else "")
        with failure_shot(server, "setup"):
            open_notebook(browser, server, EXPLORE_NB)
            for index in range(EXPLORE_CELL + 1):
                run_and_wait(browser, index)
            explorer(browser)
        yield server


@contextlib.contextmanager
def failure_shot(front: dict[str, Any], name: str) -> Iterator[None]:
    try:
        yield
    except BaseException:
        shot = front["profile"].parent / f"failure-{name}.png"
        front["driver"].save_screenshot(str(shot))
        print(f"screenshot of the failure: {shot}; the server's log: {front['log']}")
        raise


def explorer(driver: Any) -> Any:
    """The live explorer's root (the outermost widget box in its cell's output)."""
    cell = driver.find_elements("css selector", ".jp-Notebook .jp-Cell")[EXPLORE_CELL]
    return wait_for(lambda: cell.find_elements("css selector", ".widget-vbox"),
                    "the explore widget")[0]


def plan_text(driver: Any) -> str:
    """What the explorer says (title, plan, fates, legend, message): its HTML views' text."""
    return str(driver.execute_script(
        "return Array.from(arguments[0].querySelectorAll('.widget-html'))"
        "  .map(e => e.innerText).join('\\n');", explorer(driver)))


def plan_line(text: str, start: str) -> str:
    return next((line for line in text.splitlines() if line.startswith(start)), "")


CONTROL_JS = """
const [root, label] = arguments;
for (const box of root.querySelectorAll('.widget-inline-hbox')) {
  const l = box.querySelector('.widget-label');
  if (l && l.textContent.trim().startsWith(label)) return box;
}
return null;
"""


def control(driver: Any, label: str) -> Any:
    return wait_for(lambda: driver.execute_script(CONTROL_JS, explorer(driver), label),
                    f"the explorer's {label!r} control", timeout=10)


def move(driver: Any, label: str, kind: str, value: str) -> None:
    """Type ``value`` into a field, or into a slider's readout (what dragging its handle to
    that value does), and press Enter, as a person would."""
    from selenium.webdriver.common.keys import Keys

    box = control(driver, label)
    target = box.find_element("css selector", "input" if kind == "text" else ".widget-readout")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", target)
    target.click()
    driver.execute_script(
        "const e = arguments[0];"
        "if (e.select) { e.select(); return; }"
        "const r = document.createRange(); r.selectNodeContents(e);"
        "const s = window.getSelection(); s.removeAllRanges(); s.addRange(r);", target)
    target.send_keys(value)
    target.send_keys(Keys.ENTER)


def button(driver: Any, start: str) -> Any:
    return wait_for(lambda: [b for b in explorer(driver).find_elements("css selector", "button")
                             if b.text.strip().startswith(start) and b.is_displayed()],
                    f"the {start!r} button", timeout=15)[0]


def click(driver: Any, element: Any) -> None:
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def plan_changed(driver: Any, next_line: str, expect: str | None) -> bool:
    """The plan's "changed:" line names ``expect`` (None: its "next message:" line is no
    longer ``next_line``)."""
    text = plan_text(driver)
    if expect:
        return f" {expect} " in plan_line(text, "changed:")
    return plan_line(text, "next message:") != next_line


def test_explorer_controls_change_the_plan(front: dict[str, Any]) -> None:
    """Every control, moved in the browser, changes the plan the explorer shows."""
    driver = front["driver"]
    with failure_shot(front, "controls"):
        start = plan_text(driver)
        assert "changed:" not in start, start      # the session's own settings to begin with
        assert plan_line(start, "next message:"), start
        for label, kind, value, expect in CONTROLS:
            before = plan_line(plan_text(driver), "next message:")
            move(driver, label, kind, value)
            wait_for(partial(plan_changed, driver, before, expect),
                     f"{label} to change the plan ({expect or 'next message:'})")
        moved = plan_line(plan_text(driver), "changed:")
        assert all(f" {e} " in moved for *_, e in CONTROLS if e), moved   # all moves at once
        shoot(driver, explorer(driver), f"explore{front['suffix']}.png")
        click(driver, button(driver, "Reset"))
        wait_for(lambda: "changed:" not in plan_text(driver), "Reset to clear the changes")
        assert plan_line(plan_text(driver), "next message:") == plan_line(start,
                                                                          "next message:")


def test_explorer_replay_shows_the_plot(front: dict[str, Any]) -> None:
    """Replay with these settings: the table and the plot, an image of nonzero size."""
    driver = front["driver"]
    with failure_shot(front, "replay"):
        click(driver, button(driver, "Replay"))
        cell = driver.find_elements("css selector", ".jp-Notebook .jp-Cell")[EXPLORE_CELL]
        wait_for(lambda: "replayed" in plan_text(driver), "the replay to finish",
                 timeout=180, every=0.5)
        assert "[object Object]" not in cell.text
        assert "replay of session default" in cell.text        # the table, named as the user does
        plot = wait_for(lambda: cell.find_elements("css selector", "img.ctxr-replay-plot"),
                        "the replay's plot (img.ctxr-replay-plot)", timeout=15)[0]
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
        size = wait_for(lambda: driver.execute_script(
            "const i = arguments[0]; const r = i.getBoundingClientRect();"
            "return i.complete && i.naturalWidth > 0 && r.width > 0 && r.height > 0"
            "  && [i.naturalWidth, r.width, r.height];", plot), "the plot to load and show")
        assert all(n > 0 for n in size), size
        shoot(driver, explorer(driver), f"explore-replay{front['suffix']}.png")


def test_our_outputs_read_at_contrast(front: dict[str, Any]) -> None:
    """Every text element of the panel, the turn card and the live explorer reads at 4.5:1
    or more against its effective background (the dark theme is the one that was broken)."""
    driver = front["driver"]
    with failure_shot(front, "contrast"):
        check_contrast(driver, live=True)


def test_explorer_apply_then_undo(front: dict[str, Any]) -> None:
    """Apply a cap to the session, then "Undo apply": the explorer's fields and the
    session's settings (``%chat config`` in a later cell) are as they were."""
    driver = front["driver"]
    with failure_shot(front, "apply"):
        cap = control(driver, "payload cap").find_element("css selector", "input")
        original, first = cap.get_attribute("value"), plan_line(plan_text(driver), "cap ")
        assert first, plan_text(driver)
        move(driver, "payload cap", "text", "16KB")
        wait_for(partial(plan_changed, driver, "", "max_payload"), "the cap to be planned")
        click(driver, button(driver, "Apply"))
        wait_for(lambda: "changed:" not in plan_text(driver)
                 and plan_line(plan_text(driver), "cap ") != first,
                 "Apply: the session has the cap (the plan changes nothing more)")
        assert "16 KB" in plan_line(plan_text(driver), "cap "), plan_text(driver)
        undo = wait_for(lambda: [b for b in explorer(driver).find_elements(
            "css selector", "button.ctxr-undo") if b.is_displayed()], "the Undo apply button",
            timeout=15)[0]
        assert "Undo apply" in undo.text
        click(driver, undo)
        wait_for(lambda: plan_line(plan_text(driver), "cap ") == first,
                 f"Undo apply to bring back {first!r}")
        wait_for(lambda: cap.get_attribute("value") == original,
                 f"the cap field to read {original!r} again")
        assert "changed:" not in plan_text(driver)
        run_and_wait(driver, CONFIG_AFTER)
        assert outputs_text(driver, CONFIG_AFTER) == outputs_text(driver, CONFIG_BEFORE)


def test_saved_notebook_reopens_readable(front: dict[str, Any]) -> None:
    """Save, shut the kernel down, reopen with no widget state: the panel's snapshot, the
    turn card and the explorer's snapshot (its replay and plot too) read as they did; no
    "Error displaying widget"."""
    driver = front["driver"]
    with failure_shot(front, "reload"):
        cell = driver.find_elements("css selector", ".jp-Notebook .jp-Cell")[EXPLORE_CELL]
        if not cell_done(driver, CONFIG_AFTER) and "replayed" not in plan_text(driver):
            click(driver, button(driver, "Replay"))   # run alone (-k): the replay to keep
            wait_for(lambda: "replayed" in plan_text(driver), "the replay to finish",
                     timeout=180, every=0.5)
            wait_for(lambda: cell.find_elements("css selector", "img.ctxr-replay-plot"),
                     "the replay's plot")
        if not cell_done(driver, CONFIG_AFTER):
            run_and_wait(driver, CONFIG_AFTER)     # the next cell ran: the explorer snapshots
        _try(lambda: wait_for(lambda: driver.find_elements("css selector", ".jp-Notebook "
                              ".jp-Cell")[EXPLORE_CELL].find_elements(
                                  "css selector", "div.ctxr-explore-snapshot"),
                              "the explorer's snapshot once the next cell ran", timeout=30))
        saved = save_and_shut_down(driver, front, EXPLORE_NB,
                                   lambda outputs: bool(outputs[CONFIG_AFTER]))
        open_notebook(driver, front, EXPLORE_NB)
        cells = driver.find_elements("css selector", ".jp-Notebook .jp-Cell")
        panel = outputs_text(driver, PANEL_CELL)
        assert "live panel · session default" in panel and "idle · as of" in panel, panel
        assert "✓ answered after 1 recovery step" in outputs_text(driver, CARD_CELL)
        suffix = front["suffix"]
        if suffix:   # lab-light's panel and card: test_panel_and_turn_cards_in_jupyterlab
            shoot(driver, cells[PANEL_CELL].find_element("css selector", ".ctxr-panel"),
                  f"panel-idle{suffix}.png")
            shoot(driver, cells[CARD_CELL].find_element("css selector", ".ctxr-card"),
                  f"turn-card{suffix}.png")
        page = driver.find_element("css selector", ".jp-Notebook").text
        assert "Error displaying widget" not in page and "model not found" not in page, \
            outputs_text(driver, EXPLORE_CELL)
        snap = wait_for(lambda: cells[EXPLORE_CELL].find_elements(
            "css selector", "div.ctxr-explore-snapshot"), "the explorer's snapshot")[0]
        text = " ".join(snap.text.split())
        for words in ("session default", "before:", "after:", "kept", "pinned", "replay"):
            assert words in text, (words, text)
        for index in (PANEL_CELL, EXPLORE_CELL):   # snapshots in the file, with a text twin
            assert all(WIDGET not in o.get("data", {}) for o in saved[index]), saved[index]
            assert any("text/html" in o.get("data", {}) and "text/plain" in o.get("data", {})
                       for o in saved[index]), saved[index]
        shoot(driver, snap, f"explore-snapshot{suffix}.png")
        check_contrast(driver, live=False)
        plot = snap.find_element("css selector", "img.ctxr-replay-plot")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
        assert wait_for(lambda: driver.execute_script(
            "const i = arguments[0]; const r = i.getBoundingClientRect();"
            "return i.complete && i.naturalWidth > 0 && r.width > 0 && r.height > 0;", plot),
            "the saved plot to show")


def check_contrast(driver: Any, *, live: bool) -> None:
    """Every text element in our outputs (the panel, the turn cards, the explorer, live or
    as its snapshot) at 4.5:1 or more against its effective background (tests/contrast.py).
    A disabled button (the idle explorer's Cancel) is exempt, as WCAG exempts inactive
    controls."""
    from contrast import TEXT_SAMPLES_JS, low_contrast

    ours = ".ctxr-panel, .ctxr-card, div.ctxr-explore-snapshot"
    if live:
        driver.execute_script("arguments[0].dataset.ctxrExplorer = 'live'", explorer(driver))
        ours += ", [data-ctxr-explorer='live']"
    kinds = driver.execute_script(
        "const q = (s) => document.querySelectorAll(s).length;"
        "return [q('.ctxr-panel'), q('.ctxr-card'),"
        "        q('div.ctxr-explore-snapshot, [data-ctxr-explorer]')];")
    assert all(kinds), f"the panel, a turn card and the explorer on the page: {kinds}"
    disabled = set(driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]))"
        "  .flatMap(r => Array.from(r.querySelectorAll('button:disabled')))"
        "  .map(b => b.innerText.trim());", ours))
    samples = [s for s in driver.execute_script(TEXT_SAMPLES_JS, ours)
               if not (s["where"].startswith("button") and s["text"] in disabled)]
    assert len(samples) > 20, samples      # the check saw the text it is about
    assert not low_contrast(samples), low_contrast(samples)
