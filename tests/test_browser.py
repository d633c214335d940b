"""The course in a real browser: the static site in headless Chromium, and lesson 2's slider in JupyterLab.

Uses Debian's Chromium (`apt-get install chromium`) driven by Python's playwright (the site extra);
playwright's own browser download is not needed. Without either the tests skip and say why, unless
AMPTEACH_REQUIRE_BROWSER is set (CI sets it), where they fail instead.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import pytest
from site_checks import ROOT, SPHINX_NOTICES, built_site

pytestmark = SPHINX_NOTICES

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LESSON_2 = "02_underflow_and_loss_scaling.ipynb"
LOCAL_HOSTS = ("127.0.0.1", "localhost")


def unavailable(reason: str):
    if os.environ.get("AMPTEACH_REQUIRE_BROWSER"):
        pytest.fail(f"{reason} (AMPTEACH_REQUIRE_BROWSER is set)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Chromium with a new, empty profile; every request that leaves this machine is refused and recorded."""
    if not os.access(CHROMIUM, os.X_OK):
        unavailable(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable('playwright is not installed: pip install -e ".[site]"')
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1280, "height": 900})
        context.outside = []

        def route(route):
            if urlsplit(route.request.url).hostname in LOCAL_HOSTS:
                route.continue_()
            else:
                context.outside.append(route.request.url)
                route.abort()

        context.route("**/*", route)
        yield context
        context.close()


def watch(page) -> list[str]:
    """Script errors of a page as they happen: uncaught exceptions and console errors."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"{page.url}: {error}"))
    page.on("console", lambda message: errors.append(f"{page.url}: console: {message.text}")
            if message.type == "error" else None)
    return errors


# ---------------------------------------------------------------- the static site

class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served():
    """The course site, served on a free localhost port for the module's tests."""
    out = built_site()[0].out
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield out, f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    thread.join()


ALL_IMAGES_LOADED = """async () => {
    const images = [...document.images];
    images.forEach(img => { img.loading = "eager"; });
    await Promise.all(images.map(img => img.complete ? null
                                  : new Promise(done => { img.onload = img.onerror = done; })));
    return {broken: images.filter(img => img.naturalWidth === 0).map(img => img.currentSrc.slice(0, 120)),
            count: images.length,
            links: [...document.querySelectorAll("a[href]")].map(a => a.href),
            ids: [...document.querySelectorAll("[id]")].map(e => e.id)};
}"""


@pytest.fixture(scope="module")
def crawl(browser, served):
    """Every page of the site opened in Chromium: its script errors, broken images, links and ids."""
    out, base = served
    page = browser.new_page()
    errors = watch(page)
    seen = {}
    for path in sorted(p for p in out.rglob("*.html") if not p.relative_to(out).parts[0].startswith("_")):
        url = base + path.relative_to(out).as_posix()
        response = page.goto(url, wait_until="load")
        assert response is not None and response.ok, url
        seen[url] = page.evaluate(ALL_IMAGES_LOADED)
    page.close()
    return base, seen, errors


def test_no_script_errors_and_nothing_fetched_from_outside(browser, crawl):
    _, seen, errors = crawl
    assert len(seen) >= len(built_site()[0].pages) + 1
    assert not errors, errors
    assert not browser.outside, f"pages asked for files outside this machine: {sorted(set(browser.outside))[:10]}"


def test_every_image_renders(crawl):
    _, seen, _ = crawl
    broken = {url: info["broken"] for url, info in seen.items() if info["broken"]}
    assert not broken, broken
    lesson_2 = next(info for url, info in seen.items() if url.endswith("02_underflow_and_loss_scaling.html"))
    assert lesson_2["count"] >= 4


def test_internal_links_resolve(browser, crawl):
    base, seen, _ = crawl
    checked: dict[str, int] = {}
    broken = []
    for url, info in seen.items():
        for link in info["links"]:
            if not link.startswith(base):
                continue
            target, anchor = urldefrag(link)
            if target not in checked:
                checked[target] = browser.request.get(target).status
            if checked[target] != 200:
                broken.append(f"{url} -> {link}: HTTP {checked[target]}")
            elif anchor and target in seen and anchor not in seen[target]["ids"]:
                broken.append(f"{url} -> {link}: no #{anchor} there")
    assert not broken, broken[:20]
    unlinked = [url for url in seen if url not in checked and not url.endswith(("search.html", "genindex.html"))]
    assert not unlinked, f"pages no other page links to: {unlinked}"


def test_search_finds_the_lesson_on_loss_scaling_with_snippets_of_its_text(browser, served):
    _, base = served
    page = browser.new_page()
    errors = watch(page)
    page.goto(base + "search.html?q=GradScaler")
    page.wait_for_selector("ul.search li a", timeout=30_000)
    page.wait_for_selector("ul.search li p.context", timeout=30_000)     # the snippets load page by page
    hits = page.eval_on_selector_all("ul.search li a", "links => links.map(a => a.getAttribute('href'))")
    snippets = page.eval_on_selector_all("ul.search li p.context", "ps => ps.map(p => p.textContent)")
    page.close()
    assert any("02_underflow_and_loss_scaling" in hit for hit in hits), hits
    assert snippets and all("GradScaler" in s or "gradscaler" in s.lower() for s in snippets[:3]), snippets[:3]
    theme = [s for s in snippets if re.search(r"\b(Light|Dark|System Settings|Contents)\b", s[:80])]
    assert not theme, f"snippets start with the theme's text: {theme[:2]}"
    assert not errors, errors


def test_the_sidebar_shows_a_section_per_lesson(browser, served):
    _, base = served
    page = browser.new_page()
    page.goto(base + "exercises/build_1_bf16_rounding.html")
    captions = page.eval_on_selector_all("nav.bd-links p.caption", "ps => ps.map(p => p.innerText.trim())")
    current = page.eval_on_selector("nav.bd-links li.current > a", "a => a.innerText.trim()")
    page.close()
    assert captions[:3] == ["Lesson 0", "Lesson 1", "Lesson 2"], captions
    assert current.startswith("Build it yourself 1"), current


# ---------------------------------------------------------------- lesson 2 in JupyterLab

# JupyterLab's settings for the test: no work besides running the lesson (no autosaves of a notebook whose
# outputs keep changing, no news toast over the page, no extension listing).
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/extensionmanager-extension/plugin": {"enabled": False},
}
RUN_ALL_LIMIT_S = 1500     # the lesson takes about 4 minutes of CPU; a loaded 2-core machine can need 3 times that


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unrun_copy(notebook: Path, folder: Path) -> Path:
    """The lesson as it is before anyone runs it: no outputs, no execution counts, no saved widget state.

    So every output the test sees, the slider included, comes from this run's kernel, a cell that did not
    run shows as not run, and JupyterLab has no stored figures or widget snapshots to render first."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    nb["metadata"].pop("widgets", None)
    copy = folder / notebook.name
    copy.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    return copy


@dataclass
class Lab:
    """A running JupyterLab server: its URL, its log file and the test's folder (for screenshots)."""
    url: str
    log: Path
    folder: Path

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def kernels(self) -> str:
        """The server's own view of its kernels: execution state, last activity, connections."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/kernels", timeout=10) as answer:
                return answer.read().decode()
        except OSError as error:
            return f"(the server did not answer: {error})"


@contextmanager
def running_lab(tmp_path: Path, root: Path, command: list[str] | None = None):
    """A JupyterLab server over `root` (no token, localhost, a free port, fresh settings), until the block ends.

    `command` is how it is started, without the test's own options (default: `jupyter lab`)."""
    for plugin, settings in LAB_SETTINGS.items():
        path = tmp_path / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    port = free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    lab = Lab(f"http://127.0.0.1:{port}", tmp_path / "jupyterlab.log", tmp_path)
    command = command or [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.root_dir={root}"]
    with open(lab.log, "w") as log:
        server = subprocess.Popen(
            [*command, "--no-browser", "--ip=127.0.0.1", f"--port={port}",
             "--ServerApp.port_retries=0", "--IdentityProvider.token=", "--ServerApp.password=", "--allow-root",
             "--LabApp.expose_app_in_browser=True", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(f"{lab.url}/api/status", timeout=5).close()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        pytest.fail(f"JupyterLab did not start (exit code {server.poll()}); "
                                    f"its log ends:\n{lab.log_tail()}")
                    time.sleep(0.5)
            yield lab
        finally:
            server.terminate()      # JupyterLab shuts its kernels down on SIGTERM
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@pytest.fixture
def jupyterlab(tmp_path):
    """A JupyterLab server over an unrun copy of lesson 2."""
    work = tmp_path / "course"
    work.mkdir()
    unrun_copy(ROOT / "notebooks" / LESSON_2, work)
    with running_lab(tmp_path, work) as lab:
        yield lab


# JupyterLab's application, exposed by --LabApp.expose_app_in_browser once it has started (undefined before).
NOTEBOOK = "window.jupyterapp?.shell?.currentWidget"
# The page's view: is the notebook open, its kernel's status, what Run All returned, each cell's state.
PAGE_STATE = f"""() => {{
    const nb = {NOTEBOOK}, state = {{app: Boolean(window.jupyterapp), notebook: nb?.title?.label ?? null,
        kernel: nb?.sessionContext?.session?.kernel?.status ?? null,
        connection: nb?.sessionContext?.session?.kernel?.connectionStatus ?? null,
        ready: Boolean(nb?.sessionContext?.isReady), runAll: window.runAll ?? null,
        dialogs: [...document.querySelectorAll(".jp-Dialog")].map(d => d.innerText.slice(0, 300))}};
    const cells = nb?.content?.model?.cells;
    if (!cells) return state;
    Object.assign(state, {{errors: [], notRun: [], running: [], code: 0}});
    for (let i = 0; i < cells.length; i++) {{
        const model = cells.get(i), cell = model.toJSON();
        if (cell.cell_type !== "code") continue;
        state.code++;
        if (cell.execution_count === null) state.notRun.push(i);
        if (model.executionState === "running") state.running.push(i);
        for (const o of cell.outputs)
            if (o.output_type === "error") state.errors.push(`${{i}}: ${{o.ename}}: ${{o.evalue}}`);
    }}
    return state;
}}"""
KERNEL_IDLE = f"""() => {{
    const nb = {NOTEBOOK};
    return Boolean(nb?.sessionContext?.isReady && nb.sessionContext.session?.kernel?.status === "idle");
}}"""
RUN_ALL = """() => { window.runAll = undefined;
    window.jupyterapp.commands.execute("notebook:run-all-cells").then(ok => { window.runAll = String(ok); },
                                                                      e => { window.runAll = String(e); }); }"""
# Marks the cell that makes the slider (scrolled into view) so the test finds the widget in that cell's output.
MARK_SLIDER_CELL = f"""async () => {{
    const nb = {NOTEBOOK}.content, cells = nb.model.cells;
    for (let i = 0; i < cells.length; i++)
        if (cells.get(i).sharedModel.getSource().includes("FigureSlider(")) {{
            nb.activeCellIndex = i;
            await nb.scrollToItem(i, "center");
            nb.widgets[i].node.dataset.test = "slider-cell";
            return i;
        }}
    return -1;
}}"""
IMAGE_BYTES = """async img => {
    const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
    let s = ""; for (const b of bytes) s += String.fromCharCode(b);
    return {src: img.src, data: btoa(s)};
}"""
KERNEL_GONE = ("dead", "restarting", "autorestarting", "terminating")


@contextmanager
def explained(page, lab: Lab, errors: list[str]):
    """Turn any failure inside into one that says why: page state, screenshot, kernels, JupyterLab's log."""
    try:
        yield
    except Exception as failure:
        try:
            state = page.evaluate(PAGE_STATE)
        except Exception as error:      # the page itself may be what broke
            state = f"(could not read the page: {error})"
        shot = lab.folder / "jupyterlab.png"
        try:
            page.screenshot(path=str(shot))
        except Exception as error:
            shot = f"(no screenshot: {error})"
        pytest.fail(f"{type(failure).__name__}: {failure}\n\npage state: {state}\nscreenshot: {shot}\n"
                    f"script errors: {errors[-10:]}\nthe server's kernels: {lab.kernels()}\n"
                    f"JupyterLab's log ends:\n{lab.log_tail()}", pytrace=True)


def run_all_cells(page) -> dict:
    """Run All, as a learner does, and wait until it returns; fail at once if the kernel dies or restarts."""
    page.evaluate(RUN_ALL)
    deadline = time.monotonic() + RUN_ALL_LIMIT_S
    while (state := page.evaluate(PAGE_STATE))["runAll"] is None:
        assert state["kernel"] not in KERNEL_GONE, f"the kernel is {state['kernel']} during Run All"
        assert time.monotonic() < deadline, f"Run All did not finish in {RUN_ALL_LIMIT_S} s"
        page.wait_for_timeout(2000)
    page.wait_for_function(KERNEL_IDLE, timeout=60_000)
    return page.evaluate(PAGE_STATE)


@pytest.mark.slow      # the lesson's own training runs: about 4 minutes of CPU
def test_lesson_2_runs_in_jupyterlab_and_its_loss_scale_slider_redraws_the_histogram(browser, jupyterlab):
    outside_before = len(browser.outside)
    page = browser.new_page()
    errors = watch(page)
    with explained(page, jupyterlab, errors):
        page.goto(f"{jupyterlab.url}/lab/tree/{LESSON_2}?reset")
        page.wait_for_function(KERNEL_IDLE, timeout=300_000, polling=500)
        state = page.evaluate(PAGE_STATE)
        assert state["notebook"] == LESSON_2 and len(state["notRun"]) == state["code"] > 20, state

        state = run_all_cells(page)
        assert state["runAll"] == "true" and not state["errors"] and not state["notRun"], state

        # The slider the lesson made, with the histogram it drew at log2 S = 0.
        assert page.evaluate(MARK_SLIDER_CELL) >= 0
        widget = page.locator("[data-test=slider-cell] .widget-vbox", has=page.locator(".widget-slider"))
        slider, readout = widget.locator(".noUi-target"), widget.locator(".widget-readout")
        image = widget.locator("img")
        image.wait_for(timeout=60_000)
        widget.scroll_into_view_if_needed()
        assert readout.inner_text().strip() == "0"
        before = image.evaluate(IMAGE_BYTES)

        # Drag the handle two fifths of the way along, as a learner would, and let go.
        handle, track = widget.locator(".noUi-handle").bounding_box(), slider.bounding_box()
        page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2)
        page.mouse.down()
        page.mouse.move(track["x"] + 0.4 * track["width"], handle["y"] + handle["height"] / 2, steps=8)
        page.mouse.up()
        page.wait_for_function("([img, src]) => img.src !== src", arg=[image.element_handle(), before["src"]],
                               timeout=120_000)
        after = image.evaluate(IMAGE_BYTES)
        moved_to = int(readout.inner_text())

        assert 10 <= moved_to <= 24, f"the slider moved to {moved_to}, not two fifths of 0..44"
        assert after["data"] != before["data"], "the histogram image did not change when the slider moved"
        assert not errors, errors
    page.close()
    assert browser.outside[outside_before:] == [], "JupyterLab asked for files outside this machine"


# ---------------------------------------------------------------- nbgrader's Validate button on an exercise

EXERCISE = "exercises/build_1_bf16_rounding.ipynb"
VALIDATE_LIMIT_S = 600     # nbgrader runs the whole notebook in a new kernel, its check starts a judge: ~20 s quiet
DIALOG = ".jp-Dialog"


def test_jupyterlab_never_tells_a_learner_an_untouched_exercise_passes(browser, tmp_path):
    """Where nbgrader is installed (a teacher's `.[teach]`, a developer's `.[dev]`), every notebook has a
    Validate button: on an untouched exercise it reports the failed check, never "Success". A learner's
    install (`pip install -e .`, no nbgrader) has no button at all."""
    from ampteach.tools import start

    folder = tmp_path / start.DEFAULT_FOLDER
    start.prepare(folder, start.find_course())
    with running_lab(tmp_path, folder, start.lab_command(folder)) as lab:
        page = browser.new_page()
        errors = watch(page)
        with explained(page, lab, errors):
            page.goto(f"{lab.url}/lab/tree/{EXERCISE}?reset")
            page.wait_for_function(KERNEL_IDLE, timeout=300_000, polling=500)
            assert page.evaluate(PAGE_STATE)["notebook"] == Path(EXERCISE).name
            button = page.locator(".jp-NotebookPanel-toolbar .validate-button")
            if importlib.util.find_spec("nbgrader") is None:
                assert button.count() == 0, "a Validate button without nbgrader"
            else:
                button.click()
                dialog = page.locator(DIALOG, has_text="Validation Results")
                dialog.wait_for(timeout=VALIDATE_LIMIT_S * 1000)
                said = dialog.inner_text()
                assert dialog.locator(".validation-failed").count() == 1, said
                assert "check_round_to_bf16(round_to_bf16)" in said and "NotImplementedError" in said, said
            assert "Success" not in page.locator("body").inner_text()
        page.close()
