"""Build the course as a static website, from the notebooks' stored outputs (nothing is re-executed).

    ampteach site --out site/                  # then open site/index.html in a browser
    ampteach site --out site/ --root ~/ampteach  # the course files of another checkout

The course map (course/README.md) is the index. Every lesson is a page, followed by the exercises
the map places after it (ampteach.tools.course_map), with previous/next links and search; the
sidebar has one section per lesson. Lessons show the outputs and figures they were saved with; a
widget shows the state it was saved with (it is live only in Jupyter). An exercise page is the
learner's version generated from its solution in memory (as `python -m ampteach.grading.exercises`
writes it), never the file in exercises/, which may hold someone's answers; solutions/ is never
published. The marks the tests read (`# NBVAL_IGNORE_OUTPUT`, "Not checked by the tests" comments,
nbval cell tags) are left off the pages. The build needs no network: Sphinx with myst-nb and the
book theme, notebook execution off, math turned into MathML while building.
"""

from __future__ import annotations

import argparse
import html
import importlib.resources
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ampteach.grading.exercises import learner_version
from ampteach.tools.course_map import LINK, Section, course_sections, lesson_label

__all__ = ["CourseNotFound", "Site", "find_root", "resolve_link", "is_page", "course_sections_of", "course_pages",
           "Links", "widget_snapshot", "without_test_marks", "static_notebook", "index_markdown", "stage", "build",
           "gpu_runs", "stage_gpu_runs",
           "article_is_main",
           "add_arguments", "run"]

PACKAGE_CHECKOUT = Path(__file__).resolve().parents[2]    # ampteach/tools/website.py -> the checkout
COURSE_MAP = Path("course/README.md")
PAGE_FOLDERS = ("notebooks", "exercises")     # published; solutions/ is not
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)          # http:, mailto:, data:, ...
LIVE_NOTE = ("Live in Jupyter: this is the widget as the notebook was saved. Run the notebook in "
             "JupyterLab to move it.")


class CourseNotFound(Exception):
    """The folder given as the course's root holds no course map or no notebooks."""


@dataclass
class Site:
    """What `build` made: the output folder, the pages in course order, Sphinx's warnings, the time."""

    out: Path
    pages: list[Path]
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    unmapped: list[Path] = field(default_factory=list)


# ---------------------------------------------------------------- which pages, in which order

def find_root(root: str | Path | None = None) -> Path:
    """The course checkout: `root` if given, else this package's checkout, else the current directory."""
    candidates = [Path(root)] if root is not None else [PACKAGE_CHECKOUT, Path.cwd()]
    for candidate in candidates:
        if (candidate / COURSE_MAP).is_file() and any((candidate / "notebooks").glob("*.ipynb")):
            return candidate.resolve()
    where = " or ".join(str(c.resolve()) for c in candidates)
    raise CourseNotFound(f"no course found in {where}: expected {COURSE_MAP} and notebooks/*.ipynb there. "
                         "Pass --root with the folder of an ampteach checkout (the one holding notebooks/).")


def resolve_link(root: Path, source: Path, target: str, virtual: frozenset[Path] = frozenset()) -> Path | None:
    """A relative link from `source` (relative to root) as a path relative to root, or None if it leaves it
    or names nothing. `virtual` pages count as existing (the exercises, made from their solutions).

    Read relative to the source file first; a link that only makes sense from the root
    (`notebooks/02_x.ipynb` written inside a lesson) is read from the root.
    """
    path = target.split("#", 1)[0]
    if not path or EXTERNAL.match(path) or path.startswith("/"):
        return None
    top = root.resolve()
    for base in (root / source.parent, root):
        candidate = (base / path).resolve()
        if not candidate.is_relative_to(top):
            continue
        if candidate.exists() or candidate.relative_to(top) in virtual:
            return candidate.relative_to(top)
    return None


def is_page(relative: Path | None) -> bool:
    return (relative is not None and relative.suffix == ".ipynb" and len(relative.parts) == 2
            and relative.parts[0] in PAGE_FOLDERS)


def course_sections_of(root: Path) -> list[Section]:
    """The lessons (notebooks/) and exercises (one per solution in solutions/) in the course map's order."""
    lessons = [p.stem for p in sorted((root / "notebooks").glob("*.ipynb"))]
    exercises = [p.stem for p in sorted((root / "solutions").glob("*.ipynb"))]
    return course_sections((root / COURSE_MAP).read_text(encoding="utf-8"), lessons, exercises)


def course_pages(root: Path) -> tuple[list[Path], list[Path]]:
    """(pages in course order: each lesson, then its exercises; the pages the course map does not link to).

    An exercise page is exercises/NAME.ipynb for every solutions/NAME.ipynb, whether or not that file
    exists in exercises/ (its page is made from the solution)."""
    pages = []
    for section in course_sections_of(root):
        pages += [Path("notebooks", f"{section.lesson}.ipynb")] if section.lesson else []
        pages += [Path("exercises", f"{name}.ipynb") for name in section.exercises]
    linked = set()
    for _, _, target, _ in LINK.findall((root / COURSE_MAP).read_text(encoding="utf-8")):
        linked.add(resolve_link(root, COURSE_MAP, target, frozenset(pages)))
    return pages, [p for p in pages if p not in linked]


# ---------------------------------------------------------------- the notebooks as static pages

@dataclass
class Links:
    """Rewrites the course's Markdown links for the site, and collects what it met on the way.

    A link to a page points at that page; a local image is copied along (into `images`); a link to
    anything else of the course (a solution, a data file) becomes "text: `path`", since those
    files are not part of the site; a link to a file that does not exist becomes its text (and a line
    in `problems`). External links and in-page anchors are left alone.
    """

    root: Path
    pages: list[Path]
    images: set[Path] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    def resolve(self, source: Path, target: str) -> Path | None:
        return resolve_link(self.root, source, target, frozenset(self.pages))

    def rewrite(self, text: str, source: Path, staged: Path) -> str:
        """`text` of `source` with its links made to work from its staged place `staged` (both relative to root)."""
        return LINK.sub(lambda match: self.replace(match, source, staged), text)

    def replace(self, match: re.Match, source: Path, staged: Path) -> str:
        bang, label, target, title = match.groups()
        if target.startswith(("#", "/")) or EXTERNAL.match(target):
            return match.group(0)
        relative = self.resolve(source, target)
        if relative is None:
            self.problems.append(f"{source.as_posix()} links to {target}, which is no file of the course: "
                                 "shown as text")
            return "" if bang else label
        anchor = "#" + target.split("#", 1)[1] if "#" in target else ""
        if is_page(relative) and relative in self.pages or bang and (self.root / relative).is_file():
            if bang:
                self.images.add(relative)
            return f"{bang}[{label}]({os.path.relpath(relative, staged.parent)}{anchor}{title or ''})"
        shown = relative.as_posix() + ("/" if (self.root / relative).is_dir() else "")
        return label if label.strip("`").rstrip("/") == shown.rstrip("/") else f"{label}: `{shown}`"


def widget_snapshot(model_id: str, state: dict) -> str | None:
    """A saved widget as static HTML (images inline), with the live-in-Jupyter note if it takes input.

    Walks the widget's saved state (ipywidgets' models: boxes, HTML, images, sliders, buttons, progress
    bars, Output), so the page shows what the notebook showed when it was saved, without a kernel or a
    script. None if the notebook holds no state for it.
    """
    interactive = False

    def label(s: dict) -> str:
        return f'<span class="widget-label">{html.escape(s["description"])}</span> ' if s.get("description") else ""

    def walk(ref: str) -> str:
        nonlocal interactive
        model = state.get(ref.removeprefix("IPY_MODEL_"))
        if model is None:
            return ""
        name, s = model.get("model_name", ""), model.get("state", {})
        if "children" in s:
            row = "widget-row" if name in ("HBoxModel", "GridBoxModel") else "widget-col"
            return f'<div class="{row}">{"".join(walk(child) for child in s["children"])}</div>'
        if name in ("HTMLModel", "HTMLMathModel"):
            return f'<div class="widget-html">{label(s)}{s.get("value", "")}</div>'
        if name == "LabelModel":
            return f'<span class="widget-label">{html.escape(str(s.get("value", "")))}</span>'
        if name == "ImageModel":
            return "".join(image(f"image/{s.get('format', 'png')}", b["data"]) for b in model.get("buffers", [])
                           if b.get("path") == ["value"] and b.get("encoding") == "base64")
        if name in ("FloatProgressModel", "IntProgressModel"):
            return f'<span>{label(s)}<progress value="{s.get("value", 0)}" max="{s.get("max", 100)}"></progress></span>'
        if name == "OutputModel":
            return "".join(output_html(output) for output in s.get("outputs", []))
        interactive = True
        style = state.get(str(s.get("style", "")).removeprefix("IPY_MODEL_"), {}).get("state", {})
        named = "" if name == "ButtonModel" else label(s)       # a button shows its description itself
        return f'<span class="widget-control">{named}{control(name, s, style.get("button_color"))}</span>'

    if model_id not in state:
        return None
    body = walk(model_id)
    note = f'<p class="widget-note">{LIVE_NOTE}</p>' if interactive else ""
    return f'<div class="widget-static">{note}{body}</div>'


def image(mime: str, data: str) -> str:
    return f'<img class="widget-image" alt="figure" src="data:{mime};base64,{data.strip()}">'


def control(name: str, s: dict, color: str | None = None) -> str:
    """A disabled HTML control showing an input widget's saved value (a button in its colour)."""
    value = s.get("value", "")
    if "Slider" in name and not isinstance(value, list):
        return (f'<input type="range" disabled min="{s.get("min", 0)}" max="{s.get("max", 100)}" '
                f'step="{s.get("step", 1)}" value="{value}"> '
                f'<span class="widget-readout">{html.escape(str(value))}</span>')
    if name in ("ButtonModel", "ToggleButtonModel"):
        background = f' style="background-color: {html.escape(color)}"' if color else ""
        text = s.get("description", "") if name == "ButtonModel" else str(value)
        return f'<button disabled{background}>{html.escape(text)}</button>'
    if name == "CheckboxModel":
        return f'<input type="checkbox" disabled{" checked" if value else ""}>'
    labels, index = s.get("_options_labels"), s.get("index")
    if labels is not None and isinstance(index, int) and 0 <= index < len(labels):
        return f'<select disabled><option selected>{html.escape(str(labels[index]))}</option></select>'
    return f'<input type="text" disabled value="{html.escape(str(value))}">'


def output_html(output: dict) -> str:
    """One output of an Output widget as HTML."""
    if output.get("output_type") == "stream":
        return f"<pre>{html.escape(''.join(output.get('text', '')))}</pre>"
    data = output.get("data", {})
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            return image(mime, "".join(data[mime]))
    if "text/html" in data:
        return "".join(data["text/html"])
    return f"<pre>{html.escape(''.join(data.get('text/plain', '')))}</pre>"


def note_cell(page: Path) -> nbformat.NotebookNode:
    """The note under a page's title: where the notebook is and how to run it."""
    if page.parts[0] == "exercises":
        body = (f"This is the exercise as you get it. `ampteach start` puts it in a course folder of your own as "
                f"`{page.as_posix()}`: work through it in JupyterLab there, then grade it with "
                f"`ampteach grade {page.as_posix()}`.")
    else:
        body = (f"This page shows the lesson with the outputs it was saved with. To run it and change it, "
                f"`ampteach start` puts it in a course folder of your own as `{page.as_posix()}` and opens "
                f"JupyterLab there.")
    return nbformat.v4.new_markdown_cell(f"```{{note}}\n{body}\n```")


TEST_MARK = re.compile(r"^\s*#\s*NBVAL_[A-Z_]+\s*$")
UNCHECKED_NOTE = re.compile(r"^\s*#\s*Not checked by the tests\b", re.I)


def without_test_marks(cell: nbformat.NotebookNode) -> None:
    """Take off a cell what is there for the tests, not for a reader: `# NBVAL_...` comment lines, a
    "# Not checked by the tests: ..." comment (with the comment lines that continue it), nbval's tags."""
    if cell.cell_type == "code":
        lines, in_note = [], False
        for line in cell.source.splitlines():
            in_note = bool(UNCHECKED_NOTE.match(line)) or (in_note and line.lstrip().startswith("#"))
            if not in_note and not TEST_MARK.match(line):
                lines.append(line)
        cell.source = "\n".join(lines)
    tags = cell.metadata.get("tags")
    if tags is not None:
        cell.metadata["tags"] = [tag for tag in tags if not tag.startswith("nbval")]
        if not cell.metadata["tags"]:
            del cell.metadata["tags"]


def page_notebook(root: Path, page: Path) -> nbformat.NotebookNode:
    """A page's notebook: the lesson's file, or an exercise generated from its solution (never exercises/)."""
    if page.parts[0] == "exercises":
        return learner_version(root / "solutions" / page.name)
    return nbformat.read(root / page, as_version=4)


def static_notebook(links: Links, page: Path) -> nbformat.NotebookNode:
    """The notebook `page` as the site shows it: widgets as snapshots, links rewritten, test marks off,
    a note on top."""
    nb = page_notebook(links.root, page)
    state = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        without_test_marks(cell)
        if cell.cell_type == "markdown":
            cell.source = links.rewrite(cell.source, page, page)
        outputs = []
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                outputs.append(output)
                continue
            snapshot = widget_snapshot(view.get("model_id", ""), state)
            if snapshot is None:            # no saved state: the plain-text form, with the note
                plain = html.escape("".join(output.data.get("text/plain", "")))
                snapshot = f'<div class="widget-static"><p class="widget-note">{LIVE_NOTE}</p><pre>{plain}</pre></div>'
            outputs.append(nbformat.v4.new_output("display_data", data={"text/html": snapshot}))
        if "outputs" in cell:
            cell.outputs = outputs
    first_markdown = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), -1)
    nb.cells.insert(first_markdown + 1, note_cell(page))
    return nb


# ---------------------------------------------------------------- staging and building

def section_caption(section: Section) -> str:
    """The sidebar heading of a lesson's section: "Lesson 3" (a lesson without a number: its file name)."""
    if section.lesson is None:
        return "More exercises"
    label = lesson_label(section.lesson)
    return f"Lesson {label}" if label is not None else section.lesson.replace("_", " ")


def index_markdown(links: Links, sections: list[Section]) -> str:
    """The course map as the site's index, its links made relative to the site's root, and one toctree
    per lesson (the lesson, then its exercises), captioned: the sidebar's sections, in course order."""
    text = links.rewrite((links.root / COURSE_MAP).read_text(encoding="utf-8"), COURSE_MAP, Path("index.md"))
    trees = []
    for section in sections:
        entries = ([f"notebooks/{section.lesson}"] if section.lesson else []) + [
            f"exercises/{name}" for name in section.exercises]
        trees.append(f"```{{toctree}}\n:hidden:\n:maxdepth: 1\n:caption: {section_caption(section)}\n\n"
                     + "\n".join(entries) + "\n```\n")
    return f"{text.rstrip()}\n\n" + "\n".join(trees)


GPU_RUNS = Path("ampteach", "results", "gpu")     # benchmarks/run_lessons.py's executed copies, one folder a GPU


def gpu_runs(root: Path) -> list[tuple[str, str, list[str]]]:
    """(folder, GPU name, lesson names) of every set of lessons executed on a GPU (gpu/<machine>/summary.json)."""
    import json

    runs = []
    for summary in sorted((root / GPU_RUNS).glob("*/summary.json")):
        data = json.loads(summary.read_text(encoding="utf-8"))
        lessons = [p.stem for p in sorted(summary.parent.glob("*.ipynb"))]
        runs.append((summary.parent.name, str(data.get("device_name", summary.parent.name)), lessons))
    return runs


def stage_gpu_runs(root: Path, src: Path) -> str:
    """Each GPU's executed lessons as pages beside the CPU ones (gpu/<machine>/), with its summary as the section's
    first page, labelled with the GPU; the toctrees to add to the index ("" where no lesson ran on a GPU)."""
    trees = []
    for folder, name, lessons in gpu_runs(root):
        staged = src / "gpu" / folder
        staged.mkdir(parents=True, exist_ok=True)
        summary = (root / GPU_RUNS / folder / "summary.md").read_text(encoding="utf-8")
        (staged / "index.md").write_text(summary, encoding="utf-8")
        for lesson in lessons:
            nb = nbformat.read(root / GPU_RUNS / folder / f"{lesson}.ipynb", as_version=4)
            for cell in nb.cells:
                without_test_marks(cell)
            nbformat.write(nb, staged / f"{lesson}.ipynb")
        entries = [f"gpu/{folder}/index"] + [f"gpu/{folder}/{lesson}" for lesson in lessons]
        trees.append(f"```{{toctree}}\n:hidden:\n:maxdepth: 1\n:caption: The lessons on {name}\n\n"
                     + "\n".join(entries) + "\n```\n")
    return "\n".join(trees)


def course_title(root: Path) -> str:
    readme = root / "README.md"
    if readme.is_file():
        for line in readme.read_text(encoding="utf-8").splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return "ampteach"


def stage(root: Path, pages: list[Path], src: Path) -> list[str]:
    """Write the Sphinx project into `src`: configuration, index, the static notebooks, local images.

    Returns the problems met (links to files that do not exist), each naming the file and the link."""
    config = importlib.resources.files("ampteach.tools").joinpath("site_config")
    with importlib.resources.as_file(config) as config_dir:
        shutil.copytree(config_dir, src, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    links = Links(root, pages)
    for page in pages:
        (src / page).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(static_notebook(links, page), src / page)
    (src / "index.md").write_text(index_markdown(links, course_sections_of(root)) + stage_gpu_runs(root, src),
                                  encoding="utf-8")
    for image in links.images:
        (src / image).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / image, src / image)
    return links.problems


MAIN = '<main id="main-content" class="bd-main" role="main">'
ARTICLE = '<article class="bd-article">'


def article_is_main(out: Path) -> None:
    """Mark each page's article, not the theme's whole main column, as its main content.

    Sphinx's search builds a result's snippet from the text of the page's [role=main] element; the
    book theme puts that role on a column that also holds its header buttons ("Light Dark ...") and
    the page's table of contents, so every snippet would start with them."""
    for page in out.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        if MAIN in text and text.count(ARTICLE) == 1:
            text = text.replace(MAIN, MAIN.replace(' role="main"', "")).replace(
                ARTICLE, ARTICLE.replace(">", ' role="main">'))
            page.write_text(text, encoding="utf-8")


def prepare_out(out: Path) -> None:
    """Empty `out` if it holds an earlier site; refuse a folder with anything else in it."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} is a file; give --out a new or empty folder.")
    if out.exists() and any(out.iterdir()):
        if not (out / ".buildinfo").is_file():
            raise FileExistsError(f"{out} is not empty and holds no site built by `ampteach site`; "
                                  "give --out a new or empty folder.")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def build(out: str | Path, root: str | Path | None = None, jobs: int = 1, quiet: bool = True) -> Site:
    """Build the site into `out` from the course at `root` (see find_root); returns what was built."""
    from sphinx.cmd.build import build_main

    start = time.perf_counter()
    root, out = find_root(root), Path(out).resolve()
    pages, unmapped = course_pages(root)
    prepare_out(out)
    with tempfile.TemporaryDirectory(prefix="ampteach-site-") as tmp:
        src, warnings_file = Path(tmp) / "src", Path(tmp) / "warnings.txt"
        problems = stage(root, pages, src)
        args = ["-b", "html", "-E", "-j", str(jobs), "-d", str(Path(tmp) / "doctrees"), "-w", str(warnings_file),
                "-D", f"html_title={course_title(root)}", str(src), str(out)]
        code = build_main((["-q"] if quiet else []) + args)
        if code == 0:
            article_is_main(out)
        warnings = problems + [w.replace(f"{src}{os.sep}index.md", str(COURSE_MAP)).replace(f"{src}{os.sep}", "")
                               for w in warnings_file.read_text(encoding="utf-8").splitlines() if w.strip()]
        if code != 0:
            raise RuntimeError(f"Sphinx failed (exit {code}):\n" + "\n".join(warnings))
    return Site(out, pages, warnings, time.perf_counter() - start, unmapped)


# ---------------------------------------------------------------- the command

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path,
                        help="folder for the website (created; an earlier site there is replaced)")
    parser.add_argument("--root", type=Path, default=None,
                        help="the course checkout (default: the one this package was installed from, "
                             "else the current folder)")
    parser.add_argument("--jobs", type=int, default=1, help="Sphinx processes (default 1)")


def run(args: argparse.Namespace) -> int:
    try:
        site = build(args.out, args.root, jobs=args.jobs)
    except (CourseNotFound, FileExistsError) as error:
        print(f"ampteach site: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        print(f"ampteach site: {error.name} is missing; install the site tools with: pip install -e \".[site]\"",
              file=sys.stderr)
        return 2
    for warning in site.warnings:
        print(warning, file=sys.stderr)
    if site.unmapped:
        print("not linked from the course map, added at the end: " + ", ".join(p.as_posix() for p in site.unmapped))
    print(f"{len(site.pages)} pages in {site.seconds:.0f} s: open {site.out / 'index.html'}")
    return 0
