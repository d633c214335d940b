"""`ampteach site`: the course as a static website, built offline from the stored outputs.

The course's own site is built once for the whole test run (tests/site_checks.py); a small course
made here checks the parts the real one may not exercise today (an expected error, a broken cell,
links to solutions and to missing notebooks, a completed answer in exercises/, the test marks, the
command's errors). The lessons' own links (to their exercises, to the previous and next lesson) are
checked from the notebooks, no build needed.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import nbformat
import pytest
from site_checks import ROOT, SPHINX_NOTICES, broken_cells, built_site, cell_figures, html_pages, page_of

from ampteach.grading.exercises import learner_version
from ampteach.tools import cli
from ampteach.tools.course_map import LINK, course_sections, lesson_label
from ampteach.tools.website import course_sections_of, resolve_link

pytestmark = SPHINX_NOTICES
site = pytest.importorskip("ampteach.tools.website")
pytest.importorskip("myst_nb", reason='the site tools are not installed: pip install -e ".[site]"')

LESSONS = sorted(p.relative_to(ROOT) for p in (ROOT / "notebooks").glob("*.ipynb"))
# One page per solution, made from it in memory: exercises/ is not read (a learner's answers may be there).
EXERCISES = sorted(Path("exercises", p.name) for p in (ROOT / "solutions").glob("*.ipynb"))
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def built():
    return built_site()[0]


@pytest.fixture(scope="module")
def pages(built):
    return html_pages(built.out)


def test_the_site_builds_offline_with_a_page_per_lesson_and_exercise(built):
    attempts = built_site()[1]
    assert attempts == [], f"the build tried to reach the network: {attempts}"
    assert (built.out / "index.html").is_file() and (built.out / "searchindex.js").is_file()
    missing = [nb for nb in LESSONS + EXERCISES if not (built.out / page_of(nb)).is_file()]
    assert not missing, f"notebooks without a page: {missing}"
    assert set(built.pages) == set(LESSONS + EXERCISES)
    broken = [w for w in built.warnings if "which is no file of the course" in w]
    assert not broken, f"links in the lessons or the course map that lead nowhere: {broken}"
    assert not (built.out / "solutions").exists()
    assert not [p for p in built.out.rglob("*") if "solution" in p.name.lower() and p.suffix in (".html", ".ipynb")]


def map_rows() -> tuple[list[Path], dict[Path, str]]:
    """From the course map: its lessons in order, and each exercise's "after lesson" label (first column: 3, 6b)."""
    lessons, after = [], {}
    for line in (ROOT / "course/README.md").read_text().splitlines():
        for found in re.findall(r"\]\((?:\.\./)?((?:notebooks|exercises)/[\w.-]+\.ipynb)\)", line):
            path, first = Path(found), line.strip("| ").split("|")[0].strip()
            if path.parts[0] == "notebooks" and path not in lessons and (ROOT / path).is_file():
                lessons.append(path)
            elif path.parts[0] == "exercises" and re.fullmatch(r"\d+[a-z]?", first):
                after.setdefault(path, first)
    return lessons, after


def test_pages_follow_the_course_map_each_lesson_then_its_exercises(built, pages):
    chain, page = [Path("index.html")], pages[Path("index.html")]
    while (link := page.select_one("a.right-next")) is not None:
        chain.append(normalise(chain[-1].parent / link["href"]))
        page = pages[chain[-1]]
    assert chain[1:] == [page_of(p) for p in built.pages]
    for before, after in zip(chain, chain[1:]):
        back = pages[after].select_one("a.left-prev")
        assert back is not None and normalise(after.parent / back["href"]) == before
    lessons, after = map_rows()
    assert [p for p in built.pages if p in lessons] == lessons          # the map's lessons in the map's order
    for i, path in enumerate(built.pages):
        if path in after:                        # the lesson before it is the one its row names
            lesson = next(p for p in reversed(built.pages[:i]) if p.parts[0] == "notebooks")
            assert lesson_label(lesson.stem) == after[path], (path, lesson)


def test_the_sidebar_has_a_section_per_lesson_holding_the_lesson_then_its_exercises(built, pages):
    sidebar = pages[Path("index.html")].select_one("nav.bd-links")
    captions = [c.get_text(strip=True) for c in sidebar.select("p.caption")]
    lessons = [p for p in built.pages if p.parts[0] == "notebooks"]
    assert captions[:len(lessons)] == [f"Lesson {lesson_label(p.stem)}" for p in lessons]
    entries = []
    for caption in sidebar.select("p.caption"):
        links = caption.find_next_sibling("ul").select("a")
        entries += [normalise(Path(a["href"])) for a in links]
        first = normalise(Path(links[0]["href"]))
        assert first.parts[0] == "notebooks" or caption.get_text(strip=True) == "More exercises", caption
    assert entries == [page_of(p) for p in built.pages]


def test_search_snippets_come_from_the_article_alone(pages):
    for path, page in pages.items():
        if path.parts[0] in ("notebooks", "exercises"):
            main = page.select("[role=main]")
            assert len(main) == 1 and main[0].name == "article", path
            text = main[0].get_text(" ", strip=True)
            assert not re.search(r"\b(Light|Dark|System Settings)\b", text[:200]), (path, text[:200])


def normalise(path: Path) -> Path:
    """a/../b.html#x -> b.html"""
    parts: list[str] = []
    for part in Path(str(path).split("#")[0]).parts:
        if part == "..":
            parts.pop()
        elif part != ".":
            parts.append(part)
    return Path(*parts)


@pytest.mark.parametrize("lesson", [p for p in LESSONS if not p.name.startswith("00")], ids=lambda p: p.stem)
def test_every_lesson_from_1_on_shows_its_figures(built, pages, lesson):
    figures = cell_figures(pages[page_of(lesson)])
    assert figures, f"{lesson} shows no figure"
    for img in figures:
        src = img["src"]
        data = (base64.b64decode(src.split(",", 1)[1]) if src.startswith("data:")
                else (built.out / page_of(lesson).parent / src).read_bytes())
        assert data.startswith(PNG), f"{lesson}: {src[:80]} is not a PNG"


def test_no_page_shows_a_traceback(pages):
    broken = {str(path): cells for path, page in pages.items() if (cells := broken_cells(page))}
    assert not broken, f"pages with a traceback outside a raises-exception cell: {broken}"


def test_no_page_names_an_author_sphinx_made_up(pages):
    """Sphinx's default author is "Author name not set", which the book theme prints as every page's footer."""
    said = {path: page.get_text(" ", strip=True) for path, page in pages.items()}
    assert not [path for path, text in said.items() if "Author name not set" in text or "By Author" in text]
    assert not [path for path, page in pages.items() if page.select(".component-author")]


def test_widgets_show_their_saved_state_with_a_note_that_they_are_live_in_jupyter(pages):
    lesson = pages[Path("notebooks/02_underflow_and_loss_scaling.html")]
    sliders = [w for w in lesson.select(".widget-static") if w.select_one('input[type="range"][max="44"]')]
    assert len(sliders) == 1, "lesson 2's loss-scale slider is not on its page"
    assert "Live in Jupyter" in sliders[0].get_text() and sliders[0].select_one("img[src^='data:image/png']")
    assert "flushed to 0" in sliders[0].get_text()                 # the caption it was saved with
    for path, page in pages.items():
        text = page.get_text()
        assert "FigureSlider(children=" not in text and "widget-view+json" not in str(page), path
    bars = [bar for page in pages.values() for bar in page.select(".widget-static progress")]
    assert bars and all(float(bar["value"]) == float(bar["max"]) for bar in bars), "progress bars as saved: finished"


def test_math_is_mathml_not_tex(pages):
    lesson = pages[Path("notebooks/01_float_formats.html")]
    assert lesson.select("math")
    prose = " ".join(p.get_text() for p in lesson.select("article p"))
    assert not re.search(r"\$[^$\s][^$]*\$", prose), "TeX left unrendered in lesson 1"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda p: p.stem)
def test_exercise_pages_show_the_learners_version_not_the_solution(pages, exercise):
    text = "\n".join(cell.get_text() for cell in pages[page_of(exercise)].select(".cell_input"))   # its code cells
    learner = learner_version(ROOT / "solutions" / exercise.name)
    learner_lines = {line.strip() for c in learner.cells if c.cell_type == "code" for line in c.source.splitlines()}
    for cell in learner.cells:
        first = [line for line in cell.source.strip().splitlines() if not line.startswith("# NBVAL")][:1]
        if cell.cell_type == "code" and first:
            assert first[0].strip() in text
    solution_path = ROOT / "solutions" / exercise.name
    if solution_path.is_file():
        solution = nbformat.read(solution_path, as_version=4)
        only_in_solution = {line.strip() for c in solution.cells if c.cell_type == "code"
                            for line in c.source.splitlines()} - learner_lines
        shown = [line for line in only_in_solution if len(line) >= 25 and line in text]
        assert not shown, f"{exercise}'s page shows solution code: {shown[:3]}"


def test_links_between_pages_resolve(built, pages):
    ids = {path: {tag["id"] for tag in page.select("[id]")} for path, page in pages.items()}
    broken = []
    for path, page in pages.items():
        for a in page.select("a[href]"):
            href = a["href"]
            if re.match(r"^[a-z]+:", href) or href.startswith("#") and href[1:] in ids[path]:
                continue
            target = normalise(path.parent / href) if not href.startswith("#") else path
            anchor = href.split("#", 1)[1] if "#" in href else ""
            if not (built.out / target).is_file() or anchor and target in ids and anchor not in ids[target]:
                broken.append(f"{path}: {href}")
    assert not broken, broken
    index = {normalise(Path(a["href"])) for a in pages[Path("index.html")].select("article a[href]")}
    course_map = (ROOT / "course/README.md").read_text()
    for name in re.findall(r"\]\((?:\.\./)?((?:notebooks|exercises)/[\w.-]+\.ipynb)", course_map):
        if (ROOT / name).is_file():
            assert page_of(Path(name)) in index, f"the course map's link to {name} does not lead to its page"


# ---------------------------------------------------------------- the lessons' own links, from the notebooks

def lesson_targets(lesson: Path) -> list[str]:
    """The relative link targets in a lesson's text cells."""
    nb = nbformat.read(ROOT / lesson, as_version=4)
    return [target for cell in nb.cells if cell.cell_type == "markdown"
            for _, _, target, _ in LINK.findall(cell.source)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith("#")]


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_every_relative_link_in_a_lesson_resolves(lesson):
    broken = [t for t in lesson_targets(lesson) if resolve_link(ROOT, lesson, t, frozenset(EXERCISES)) is None]
    assert not broken, f"{lesson} links to what is not there: {broken}"


SECTIONS = [s for s in course_sections_of(ROOT) if s.lesson]


@pytest.mark.parametrize("index", range(len(SECTIONS)), ids=lambda i: SECTIONS[i].lesson)
def test_each_lesson_links_its_exercises_and_the_lessons_before_and_after_it(index):
    section = SECTIONS[index]
    lesson = Path("notebooks", f"{section.lesson}.ipynb")
    linked = {resolve_link(ROOT, lesson, t, frozenset(EXERCISES)) for t in lesson_targets(lesson)}
    wanted = [Path("exercises", f"{name}.ipynb") for name in section.exercises]
    around = SECTIONS[max(index - 1, 0):index + 2]
    wanted += [Path("notebooks", f"{s.lesson}.ipynb") for s in around if s is not section]
    missing = [p.as_posix() for p in wanted if p not in linked]
    assert not missing, (f"lesson {lesson_label(section.lesson)} ({lesson}) has no link to {missing} (the exercises "
                         f"the course map places after it, the lessons before and after it)")


def test_the_course_order_puts_each_exercise_after_the_lesson_its_row_names():
    course_map = ("| 1 | [l1](../notebooks/01_b.ipynb) |\n| 3 | [l3](../notebooks/03_d.ipynb) |\n"
                  "| 0 | [l0](../notebooks/00_a.ipynb) |\n| 0 | [e](../exercises/e0.ipynb) |\n"
                  "| 9 | [x](../exercises/e9.ipynb) |\n| 1 | [y](../exercises/e1.ipynb) |\n")
    sections = course_sections(course_map, ["00_a", "01_b", "02_c", "03_d"], ["e0", "e1", "e9", "new"])
    assert [(s.lesson, s.exercises) for s in sections] == [     # the map's order; 02_c, not on it, by number
        ("01_b", ["e1"]), ("02_c", []), ("03_d", []), ("00_a", ["e0"]), (None, ["e9", "new"])]


def test_a_lesson_split_in_two_has_a_lettered_part_with_its_own_exercises():
    course_map = ("| 6 | [l6](../notebooks/06_a.ipynb) |\n| 7 | [l7](../notebooks/07_c.ipynb) |\n"
                  "| 6b | [x](../exercises/e6b.ipynb) |\n| 6 | [y](../exercises/e6.ipynb) |\n")
    sections = course_sections(course_map, ["06_a", "06b_b", "07_c"], ["e6", "e6b"])
    assert [(s.lesson, s.exercises) for s in sections] == [("06_a", ["e6"]), ("06b_b", ["e6b"]), ("07_c", [])]
    assert [lesson_label(n) for n in ("00_start", "06b_b", "11_fp4", "intro")] == ["0", "6b", "11", None]


# ---------------------------------------------------------------- a small course made here

def notebook(*cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = list(cells)
    return nb


def error_cell(source: str, tags=()) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": list(tags)} if tags else {})
    cell.outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="no",
                                           traceback=["Traceback (most recent call last):", "ValueError: no"])]
    return cell


@pytest.fixture(scope="module")
def small_course(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    for folder in ("course", "notebooks", "exercises", "solutions", "course/results"):
        (root / folder).mkdir(exist_ok=True)
    (root / "README.md").write_text("# A small course\n")
    (root / "course/README.md").write_text(
        "# Course map\n\n"
        "| # | notebook |\n|---|---|\n"
        "| 2 | [notebooks/02_broken.ipynb](../notebooks/02_broken.ipynb) |\n"
        "| 1 | [notebooks/01_expected.ipynb](../notebooks/01_expected.ipynb) |\n"
        "| 3 | [notebooks/03_not_yet.ipynb](../notebooks/03_not_yet.ipynb) |\n"
        "| e | [exercises/e1.ipynb](../exercises/e1.ipynb) ([solution](../solutions/e1.ipynb)) |\n"
        "| 1 | [exercises/e3.ipynb](../exercises/e3.ipynb) |\n\n"
        "Results live in [`course/results/`](results/).\n")
    figure = nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\n# Not checked by the tests: the kernels differ\n"
                                       "# from CPU to CPU.\nplot()  # the figure",
                                       metadata={"tags": ["nbval-ignore-output"]})
    figure.outputs = [nbformat.v4.new_output("display_data", data={
        "image/png": base64.b64encode(PNG + b"\0" * 16).decode(), "text/plain": "<Figure>"})]
    (root / "notebooks/figures").mkdir()
    (root / "notebooks/figures/diagram.png").write_bytes(base64.b64decode(figure.outputs[0].data["image/png"]))
    unsaved = nbformat.v4.new_code_cell("FigureSlider(draw)")           # a widget whose state was not saved
    unsaved.outputs = [nbformat.v4.new_output("execute_result", execution_count=1, data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "f00", "version_major": 2, "version_minor": 0},
        "text/plain": "FigureSlider(children=(IntSlider(value=0),))"})]
    nbformat.write(notebook(nbformat.v4.new_markdown_cell("# 1. Expected\n\nSee [lesson 2](02_broken.ipynb#broken) "
                                                          "and [the old one](notebooks/02_broken.ipynb).\n\n"
                                                          "![a diagram](figures/diagram.png)"),
                            figure, error_cell("raise ValueError('no')", tags=["raises-exception"]), unsaved),
                   root / "notebooks/01_expected.ipynb")
    nbformat.write(notebook(nbformat.v4.new_markdown_cell("# 2. Broken\n\n## Broken"), error_cell("oops()")),
                   root / "notebooks/02_broken.ipynb")
    for name in ("e1", "e2", "e3"):           # e2: a solution the map does not list, and no file in exercises/
        nbformat.write(notebook(nbformat.v4.new_markdown_cell(f"# {name.upper()}"), nbformat.v4.new_code_cell(
            "answer = (\n    ### BEGIN SOLUTION\n    42  # the secret\n    ### END SOLUTION\n)"),
            nbformat.v4.new_code_cell("check_answer(answer)")), root / f"solutions/{name}.ipynb")
    done = nbformat.v4.new_code_cell("answer = (\n    42  # the secret\n)\ncheck_answer(answer)")  # a learner's work
    done.outputs = [nbformat.v4.new_output("stream", text="passed check_answer: 42 is right\n")]
    nbformat.write(notebook(nbformat.v4.new_markdown_cell("# E1"), done), root / "exercises/e1.ipynb")
    return root


@pytest.fixture(scope="module")
def small_site(small_course, tmp_path_factory):
    built = site.build(tmp_path_factory.mktemp("small") / "site", small_course)
    return built, html_pages(built.out)


def test_an_expected_error_is_not_a_broken_page_but_any_other_traceback_is(small_site):
    _, pages = small_site
    expected = pages[Path("notebooks/01_expected.html")]
    assert expected.select(".tag_raises-exception .traceback"), "the expected error is shown"
    assert broken_cells(expected) == []
    assert len(broken_cells(pages[Path("notebooks/02_broken.html")])) == 1


def test_the_map_sets_the_order_and_links_to_non_pages_become_text(small_site):
    built, pages = small_site
    assert built.pages == [Path("notebooks/02_broken.ipynb"), Path("notebooks/01_expected.ipynb"),
                           Path("exercises/e3.ipynb"), Path("exercises/e1.ipynb"), Path("exercises/e2.ipynb")]
    assert built.unmapped == [Path("exercises/e2.ipynb")]
    assert any("03_not_yet.ipynb, which is no file of the course" in w for w in built.warnings)
    index = pages[Path("index.html")]
    hrefs = [a["href"] for a in index.select("article a[href]")]
    assert "notebooks/02_broken.html" in hrefs and "exercises/e1.html" in hrefs
    assert not [h for h in hrefs if "solution" in h or "results" in h or "03_not_yet" in h]
    assert "solutions/e1.ipynb" in index.get_text() and "answer = 42" not in pages[Path("exercises/e1.html")].get_text()
    lesson = pages[Path("notebooks/01_expected.html")]
    assert [a["href"].split("#")[0] for a in lesson.select("article a[href*='02_broken']")] == ["02_broken.html"] * 2
    assert cell_figures(lesson)
    diagram = lesson.select_one("article img[alt='a diagram']")
    assert (built.out / "notebooks" / diagram["src"]).read_bytes().startswith(PNG)


def test_the_site_never_shows_a_completed_answer_even_when_exercises_holds_one(small_site):
    built, pages = small_site
    for name in ("e1", "e2", "e3"):
        page = pages[Path(f"exercises/{name}.html")]
        text = page.get_text()
        assert "the secret" not in text and "passed check_answer" not in text, name
        assert "raise NotImplementedError()" in text and "check_answer(answer)" in text, name
    assert "This is the exercise as you get it" in pages[Path("exercises/e1.html")].get_text()


def test_the_test_marks_stay_off_the_pages(small_site):
    _, pages = small_site
    lesson = pages[Path("notebooks/01_expected.html")]
    text = lesson.get_text()
    assert "NBVAL" not in text and "Not checked by the tests" not in text and "from CPU to CPU" not in text
    assert "plot()  # the figure" in text and not lesson.select(".tag_nbval-ignore-output")
    assert lesson.select(".tag_raises-exception")                  # a tag a reader needs stays


def test_the_sidebar_puts_each_exercise_under_its_lesson(small_site):
    _, pages = small_site
    sidebar = pages[Path("index.html")].select_one("nav.bd-links")
    sections = {c.get_text(strip=True): [a.get_text(strip=True) for a in c.find_next_sibling("ul").select("a")]
                for c in sidebar.select("p.caption")}
    assert sections == {"Lesson 2": ["2. Broken"], "Lesson 1": ["1. Expected", "E3"], "More exercises": ["E1", "E2"]}


def test_a_widget_without_saved_state_shows_its_text_and_the_note(small_site):
    _, pages = small_site
    snapshot = pages[Path("notebooks/01_expected.html")].select_one(".widget-static")
    assert "Live in Jupyter" in snapshot.get_text() and "IntSlider(value=0)" in snapshot.get_text()


def test_the_default_course_is_this_checkout_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert site.find_root() == ROOT.resolve()


def test_the_command_runs_from_any_folder_and_says_what_is_wrong(small_course, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["site", "--out", "site", "--root", str(small_course)]) == 0
    assert (tmp_path / "site/index.html").is_file()
    assert "index.html" in capsys.readouterr().out
    assert cli.main(["site", "--out", "site", "--root", str(small_course)]) == 0      # an earlier site is replaced
    (tmp_path / "empty").mkdir()
    assert cli.main(["site", "--out", "elsewhere", "--root", str(tmp_path / "empty")]) == 2
    error = capsys.readouterr().err
    assert "no course found" in error and "notebooks" in error and "--root" in error
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine/notes.txt").write_text("keep me")
    assert cli.main(["site", "--out", "mine", "--root", str(small_course)]) == 2
    assert "not empty" in capsys.readouterr().err and (tmp_path / "mine/notes.txt").is_file()


def test_lessons_executed_on_a_gpu_are_shown_beside_the_cpu_ones_labelled_with_their_gpu(tmp_path):
    """benchmarks/run_lessons.py's copies (ampteach/results/gpu/<machine>/) become a section of the site named
    after the GPU, its summary first; without any, the site has no such section."""
    import json

    import nbformat

    from ampteach.tools.website import gpu_runs, stage_gpu_runs

    assert stage_gpu_runs(tmp_path, tmp_path / "src") == "" and gpu_runs(tmp_path) == []
    run = tmp_path / "ampteach" / "results" / "gpu" / "cuda-nvidia-h100"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"device_name": "NVIDIA H100 80GB HBM3", "lessons": []}))
    (run / "summary.md").write_text("# The lessons on NVIDIA H100 80GB HBM3\n")
    cell = nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["nbval-ignore-output"]})
    nb = nbformat.v4.new_notebook(cells=[cell])
    nbformat.write(nb, run / "00_start_here.ipynb")
    trees = stage_gpu_runs(tmp_path, tmp_path / "src")
    assert ":caption: The lessons on NVIDIA H100 80GB HBM3" in trees
    assert "gpu/cuda-nvidia-h100/index" in trees and "gpu/cuda-nvidia-h100/00_start_here" in trees
    staged = nbformat.read(tmp_path / "src" / "gpu" / "cuda-nvidia-h100" / "00_start_here.ipynb", as_version=4)
    assert "nbval-ignore-output" not in staged.cells[0].metadata.get("tags", [])
