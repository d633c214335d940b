"""Your own course folder: the lessons and exercises copied there, and JupyterLab opened at its root.

    $ ampteach start                   # ./ampteach-course, then JupyterLab on lesson 0; inside a course
                                       # folder (or below one): that folder, brought up to date
    $ ampteach start ~/amp --no-lab    # only prepare the folder (for scripts, tests, a teacher's image)
    $ ampteach start -- --allow-root --port 8890 --no-browser   # after `--`: JupyterLab's own options
    from ampteach.tools.start import prepare; report = prepare(Path("ampteach-course"))

The folder gets notebooks/ (the lessons, with the outputs they were saved with), exercises/ (each
exercise as the course hands it out: `# YOUR CODE HERE` cells, never anyone's answers) and a
README.md listing both in course order. JupyterLab starts at the folder's root, so the lessons'
links to their exercises open, and `ampteach grade exercises/NAME.ipynb` grades your work there.

Where the files come from:
    a checkout of the course (an editable install)   the lessons from its notebooks/; the exercises
                                                      generated from its solutions/ in memory (its
                                                      exercises/ may hold someone's answers)
    a plain `pip install`                             the copies installed with the package under
                                                      <prefix>/share/ampteach/ (pyproject's data-files)

Running it again never overwrites your work. .ampteach/start.json records a hash of every file as it
was written. A file you have not changed is brought up to date; a file you changed (your answers, a
lesson you ran) stays as it is, and if the course's version of it changed since, the new one is
written beside it as NAME.fresh.ipynb. A file you deleted is written again: delete an exercise and
run `ampteach start` to start it over. It says which files it kept and which fresh copies it wrote.

A course folder is a folder holding .ampteach/start.json. Run without DIR inside one, or in any folder
below one, `ampteach start` updates that folder (its README says to run it there) rather than making
a new ./ampteach-course inside it; a DIR inside a course folder is refused, with what to do instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from ampteach.grading.exercises import is_untouched_exercise, learner_notebooks
from ampteach.tools.course_map import course_sections, lesson_label

__all__ = ["DEFAULT_FOLDER", "FIRST_LESSON", "PASSES_ON", "CourseFiles", "Prepared", "find_course", "checkout_files",
           "installed_files", "course_folder_of", "choose_folder", "prepare", "lab_command", "add_arguments", "run"]

DEFAULT_FOLDER = Path("ampteach-course")
FIRST_LESSON = "notebooks/00_start_here.ipynb"
MANIFEST = Path(".ampteach/start.json")
CHECKOUT = Path(__file__).resolve().parents[2]      # ampteach/tools/start.py -> the course checkout, if any
COURSE_MAP = "course/README.md"
PASSES_ON = "JupyterLab"      # `ampteach start ... -- ARGS`: tools/cli.py hands ARGS to JupyterLab (args.passed_on)


class CourseNotFound(Exception):
    """Neither a checkout of the course nor the installed copy of its notebooks was found."""


@dataclass
class CourseFiles:
    """The files a course folder gets ({relative path: text}) and where they were read from."""

    where: str
    files: dict[str, str]
    skipped: list[str] = field(default_factory=list)   # installed exercises that hold changes: not handed out


def _read(folder: Path, pattern: str) -> dict[str, str]:
    return {f"{folder.name}/{p.name}": p.read_text(encoding="utf-8") for p in sorted(folder.glob(pattern))}


def checkout_files(root: Path) -> CourseFiles:
    """The lessons of a checkout and its exercises, generated from its solutions in memory."""
    files = _read(root / "notebooks", "*.ipynb")
    files |= {f"exercises/{name}": text for name, text in learner_notebooks(root / "solutions").items()}
    files["README.md"] = workspace_readme((root / COURSE_MAP).read_text(encoding="utf-8"), files)
    return CourseFiles(f"the course checkout {root}", files)


def installed_files(share: Path) -> CourseFiles:
    """The lessons and exercises installed with the package (<prefix>/share/ampteach/)."""
    files = _read(share / "notebooks", "*.ipynb")
    skipped = []
    for path in sorted((share / "exercises").glob("*.ipynb")):
        if is_untouched_exercise(path):
            files[f"exercises/{path.name}"] = path.read_text(encoding="utf-8")
        else:
            skipped.append(path.name)
    course_map = share / COURSE_MAP
    files["README.md"] = workspace_readme(course_map.read_text(encoding="utf-8") if course_map.is_file() else "", files)
    return CourseFiles(f"the copy installed with ampteach, {share}", files, skipped)


def data_folders() -> list[Path]:
    """Where pip puts a package's data-files: this environment's prefix, then the user's."""
    found = [Path(sysconfig.get_path("data")), Path(sys.prefix), Path(site.getuserbase())]
    return [p / "share" / "ampteach" for p in dict.fromkeys(found)]


def find_course(checkout: Path = CHECKOUT) -> CourseFiles:
    """The course this ampteach comes with: its checkout when it runs from one, else the installed copy."""
    if all((checkout / part).exists() for part in ("notebooks", "solutions", COURSE_MAP)):
        return checkout_files(checkout)
    for share in data_folders():
        if any((share / "notebooks").glob("*.ipynb")):
            return installed_files(share)
    raise CourseNotFound("found neither a checkout of the course nor its installed notebooks (looked in "
                         + ", ".join(str(p) for p in [checkout, *data_folders()])
                         + "); reinstall it: pip install ampteach, or pip install -e . in a clone")


def _title(text: str, fallback: str) -> str:
    """A notebook's first heading."""
    for cell in json.loads(text).get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", "")).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def workspace_readme(map_text: str, files: dict[str, str]) -> str:
    """The folder's README: what is where, in course order, and how to grade and update."""
    def stems(folder: str) -> list[str]:
        return [Path(p).stem for p in files if p.startswith(f"{folder}/")]

    def link(folder: str, name: str) -> str:
        path = f"{folder}/{name}.ipynb"
        return f"[{_title(files[path], name)}]({path})"

    lines = ["# Your ampteach course", "",
             "This folder is yours: `ampteach start` put the course here and will not overwrite what you change.",
             "Open the lessons in order; after each, do the exercises listed under it, then grade one from this",
             "folder with `ampteach grade exercises/NAME.ipynb`.", ""]
    for section in course_sections(map_text, stems("notebooks"), stems("exercises")):
        if section.lesson:
            label = lesson_label(section.lesson)
            lines.append(f"- {'Lesson ' + label + ': ' if label is not None else ''}"
                         f"{link('notebooks', section.lesson)}")
        else:
            lines.append("- More exercises")
        lines += [f"  - exercise: {link('exercises', name)}" for name in section.exercises]
    lines += ["", "Run `ampteach start` here again (or in any folder inside this one) to bring the course up to date:",
              "a file you changed stays as it is, and if the course's version changed, the new one is written beside",
              "it as NAME.fresh.ipynb. Delete a file and run it again to get the course's version back (an exercise",
              "to start over). Options after `--` go to JupyterLab: `ampteach start -- --allow-root --port 8890`.", ""]
    return "\n".join(lines)


def course_folder_of(path: Path) -> Path | None:
    """The course folder `path` is, or lies in: the nearest folder at or above it holding .ampteach/start.json."""
    path = Path(path).resolve()
    return next((folder for folder in (path, *path.parents) if (folder / MANIFEST).is_file()), None)


def choose_folder(given: Path | None) -> tuple[Path, bool]:
    """(the folder `ampteach start [DIR]` prepares, whether it is the course folder the command runs in).

    Given a DIR, that one. Without, the course folder the current directory is in or below, else
    ./ampteach-course: so `ampteach start` run again inside a course folder updates it."""
    if given is not None:
        return Path(given), False
    home = course_folder_of(Path.cwd())
    return (home, True) if home is not None else (DEFAULT_FOLDER, False)


# --- preparing the folder ---------------------------------------------------------------------------------

@dataclass
class Prepared:
    """What prepare() did, by relative path."""

    folder: Path
    written: list[str] = field(default_factory=list)     # new in the folder (or written again after a delete)
    updated: list[str] = field(default_factory=list)     # unchanged by you, brought up to the course's version
    kept: list[str] = field(default_factory=list)        # changed by you: left as they are
    fresh: list[tuple[str, str]] = field(default_factory=list)   # (yours, the course's new version beside it)
    first: bool = False                                  # no record of an earlier run there: the course copied whole

    def describe(self, where: str) -> str:
        """What this run did, naming every file it kept as yours and every fresh copy it wrote beside one."""
        lines = [f"your course folder: {self.folder} (from {where})"]
        if self.written and self.first:
            lessons = sum(p.startswith("notebooks/") for p in self.written)
            exercises = sum(p.startswith("exercises/") for p in self.written)
            lines.append(f"  copied the course: {lessons} lesson(s) into notebooks/, {exercises} exercise(s) into "
                         f"exercises/, and README.md (what is where, in course order)")
        elif self.written:
            lines += [f"  copied {len(self.written)} file(s) that were missing:", *(f"    {p}" for p in self.written)]
        if self.updated:
            lines += [f"  updated {len(self.updated)} file(s) you had not changed to the course's version:",
                      *(f"    {p}" for p in self.updated)]
        if self.kept:
            lines += [f"  kept {len(self.kept)} file(s) you changed, as they are:", *(f"    {p}" for p in self.kept)]
        if self.fresh:
            lines += ["  the course changed these since you got them: yours is kept, the new version is beside it:",
                      *(f"    {yours} -> {fresh}" for yours, fresh in self.fresh)]
        if not (self.written or self.updated or self.kept):
            lines.append("  up to date: every file is the course's current version")
        return "\n".join(lines)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _fresh_path(folder: Path, relative: str, text: str, given: dict[str, str]) -> str | None:
    """Where the course's new version of a file you changed goes: NAME.fresh.ipynb, or NAME.fresh-2.ipynb, ...
    when you changed that one too; None when the new version is there already."""
    path = Path(relative)
    for n in range(1, 100):
        candidate = path.with_name(f"{path.stem}.fresh{'' if n == 1 else f'-{n}'}{path.suffix}").as_posix()
        target = folder / candidate
        if not target.exists():
            return candidate
        now = _hash(target.read_text(encoding="utf-8"))
        if now == _hash(text):
            return None
        if now == given.get(candidate):          # an older fresh copy you have not touched: replace it
            return candidate
    raise FileExistsError(f"too many fresh copies of {relative} in {folder}")


def prepare(folder: Path, course: CourseFiles | None = None) -> Prepared:
    """Copy the course into `folder` (created), never overwriting a file changed since it was written there."""
    course = course or find_course()
    folder = Path(folder)
    if folder.resolve() == CHECKOUT and (CHECKOUT / "solutions").is_dir():
        raise FileExistsError(f"{folder} is the course's own checkout; give `ampteach start` a folder of your own")
    manifest = folder / MANIFEST
    owner = course_folder_of(folder.resolve().parent)
    if owner is not None and not manifest.is_file():
        raise FileExistsError(f"{folder} is inside your course folder {owner}, so it would be a second copy of the "
                              f"course there; to update yours, run `ampteach start` (without DIR) in {owner} or "
                              f"any folder below it; for a new course folder, give a DIR outside it")
    given: dict[str, str] = json.loads(manifest.read_text())["files"] if manifest.is_file() else {}
    done = Prepared(folder, first=not given)
    for relative, text in course.files.items():
        target = folder / relative
        if not target.exists():
            done.written.append(relative)
        else:
            now = _hash(target.read_text(encoding="utf-8"))
            if now == _hash(text):
                given[relative] = now
                continue
            if now != given.get(relative):             # changed by the learner (or not written by us): keep
                done.kept.append(relative)
                if given.get(relative) != _hash(text):  # and the course has something new for it
                    fresh = _fresh_path(folder, relative, text, given)
                    if fresh is not None:
                        (folder / fresh).write_text(text, encoding="utf-8")
                        given[fresh] = _hash(text)
                        done.fresh.append((relative, fresh))
                continue
            done.updated.append(relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        given[relative] = _hash(text)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"files": given}, indent=1, sort_keys=True) + "\n")
    return done


def lab_command(folder: Path, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """JupyterLab rooted at `folder` (lessons and exercises both in reach), opening lesson 0; `extra` are
    JupyterLab's own options (`--allow-root`, `--port 8890`, `--no-browser`), last, so they win."""
    return [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.root_dir={Path(folder).resolve()}",
            f"--LabApp.default_url=/lab/tree/{FIRST_LESSON}", *extra]


# --- the command ----------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = "ampteach start [-h] [--no-lab] [DIR] [-- JUPYTERLAB_OPTIONS ...]"
    parser.add_argument("folder", nargs="?", type=Path, default=None, metavar="DIR",
                        help=f"your course folder (default: the course folder you are in, else ./{DEFAULT_FOLDER}; "
                             "created if missing)")
    parser.add_argument("--no-lab", action="store_true", help="only prepare the folder; do not start JupyterLab")
    parser.epilog = ("options after `--` go to JupyterLab as they are:\n"
                     "  ampteach start -- --allow-root     as root (a container, a lab image)\n"
                     "  ampteach start -- --port 8890 --no-browser")


def _is_root() -> bool:
    return getattr(os, "geteuid", lambda: -1)() == 0


def run(args: argparse.Namespace) -> int:
    extra = list(getattr(args, "passed_on", []) or [])
    folder, here = choose_folder(args.folder)
    try:
        course = find_course()
        done = prepare(folder, course)
    except (CourseNotFound, FileExistsError) as error:
        print(f"ampteach start: {error}", file=sys.stderr)
        return 2
    if here:
        print(f"you are in your course folder {folder}: bringing it up to date (`ampteach start DIR` makes another)")
    print(done.describe(course.where))
    if course.skipped:
        print(f"  not handed out (the installed copies hold changes): {', '.join(course.skipped)}")
    if args.no_lab:
        print(f"open it with: cd {folder} && jupyter lab {' '.join(extra)}".rstrip())
        return 0
    print(f"starting JupyterLab in {folder} (stop it with Ctrl-C)")
    try:
        code = subprocess.call(lab_command(folder, extra), cwd=folder)
    except KeyboardInterrupt:
        return 0
    if code != 0 and _is_root() and "--allow-root" not in extra:
        again = " ".join(["ampteach start", *([str(args.folder)] if args.folder else []), "--", *extra, "--allow-root"])
        print("ampteach start: JupyterLab refuses to run as root unless told to, and you are root here (a container, "
              f"a lab image?): run `{again}`", file=sys.stderr)
    return code
