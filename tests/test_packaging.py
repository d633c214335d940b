"""The install story: pyproject and environment.yml agree, README and .ci/run agree, exports resolve."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
CONDA_TO_PIP = {"pytorch": "torch", "matplotlib-base": "matplotlib"}
NOT_PACKAGES = {"python", "pip"}


def split_requirement(spec: str) -> tuple[str, str]:
    name, _, version = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*((?:[<>=!~]=?.*)?)$", spec).group(1, 0, 2)
    return name.lower(), version.replace(" ", "")


def pyproject_requirements() -> dict[str, str]:
    """The core requirements: a learner's install (`pip install -e .`), which environment.yml mirrors."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(split_requirement(s) for s in project["dependencies"])


def test_dev_pulls_in_the_site_and_comparison_extras():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"ampteach[site]", "ampteach[compare]"} <= set(extras["dev"])
    assert {split_requirement(s)[0] for s in extras["compare"]} == {"torchao"}


def environment_requirements() -> dict[str, str]:
    """The conda packages listed under `dependencies:` (not the pip section), pip-named."""
    out = {}
    dependencies = (ROOT / "environment.yml").read_text().split("\ndependencies:\n", 1)[1]
    for line in dependencies.splitlines():
        m = re.match(r"^  - ([A-Za-z][^:#\s]*)\s*$", line)  # two-space list items only: not the pip: block
        if m:
            name, version = split_requirement(m.group(1))
            if name not in NOT_PACKAGES:
                out[CONDA_TO_PIP.get(name, name)] = version
    return out


def test_environment_yml_names_the_same_packages_and_versions_as_pyproject():
    assert environment_requirements() == pyproject_requirements()


def test_environment_yml_uses_conda_forge_and_installs_this_project_last_without_extras():
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"channels:\n  - conda-forge\n(?!  - )", text)
    assert text.rstrip().endswith("- -e .")


TEACHER_TOOLS = {"nbgrader", "otter-grader"}


def installed_closure(requirements: list[str]) -> set[str]:
    """Every distribution `pip install` of `requirements` brings, as this environment's installed metadata says
    (each package's requirements, with the extras asked for and the markers of this machine)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[tuple[str, frozenset]] = set()
    todo = [Requirement(r) for r in requirements]
    names = set()
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        names.add(key[0])
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue
        for spec in dist.requires or []:
            sub = Requirement(spec)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append(sub)
    return names


def test_a_learners_install_brings_no_teachers_tools():
    """No nbgrader in a learner's JupyterLab: its Validate button would judge exercises by nbgrader's rules."""
    pytest.importorskip("packaging")
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    learner = installed_closure(project["dependencies"])
    assert {"torch", "jupyterlab", "nbval"} <= learner
    assert not learner & TEACHER_TOOLS, f"the learner's install brings {sorted(learner & TEACHER_TOOLS)}"
    extras = project["optional-dependencies"]
    assert {split_requirement(r)[0] for r in extras["teach"]} == TEACHER_TOOLS
    assert "ampteach[teach]" in extras["dev"]           # CI installs dev: the export tests need the graders


def test_pyproject_core_dependencies_are_the_short_list():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {split_requirement(s)[0] for s in project["dependencies"]}
    assert names == {"torch", "jupyterlab", "matplotlib", "ipywidgets", "nbval", "tqdm", "numpy"}
    assert project["requires-python"] == ">=3.10"
    assert project["scripts"]["ampteach"] == "ampteach.tools.cli:main"


def readme_quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    quickstart = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", quickstart, re.S)]


def test_readme_quickstart_is_the_learners_install_the_developers_install_and_the_tests():
    learner, developer, test = readme_quickstart_commands()
    assert learner == "pip install -e . && ampteach start"          # no extras: no teacher's tools
    assert developer == 'pip install -e ".[dev]"'
    assert test == "pytest"
    text = (ROOT / "README.md").read_text()
    assert "AMPTEACH_DATA" in text
    assert "conda env create -f environment.yml && conda activate ampteach && ampteach start" in text


def test_ci_installs_cpu_torch_then_the_developers_install_then_runs_the_readme_test_command():
    _, developer, test = readme_quickstart_commands()
    lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
             if line.strip() and not line.strip().startswith("#")]
    pip_torch = lines.index("python -m pip install --quiet torch==2.13.0")
    pip_project = lines.index("python -m pip install --quiet " + developer.removeprefix("pip install "))
    assert pip_torch < pip_project
    assert lines[-1] == test
    assert "../shared/data/fashion-mnist-subset" in (ROOT / ".ci/run").read_text()


def test_the_readme_export_example_does_not_write_into_the_checkouts_own_course_folder():
    """`course/` is the course map's folder in a checkout; an nbgrader course goes in a folder of its own."""
    text = (ROOT / "README.md").read_text()
    exports = re.findall(r"ampteach export nbgrader (\S+)", text)
    assert exports and all(not out.rstrip("/") == "course" for out in exports), exports


def test_every_exported_name_resolves_and_every_module_imports():
    import ampteach

    for name in ampteach.__all__:
        value = getattr(ampteach, name)
        assert not isinstance(value, type(ampteach)), f"ampteach.{name} is a module, not the thing it names"
    for path in sorted((ROOT / "ampteach").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] != "__main__":
            importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))


def test_empty_top_level_folders_say_what_lives_there():
    for folder in ("course", "notebooks", "exercises", "solutions", "tests", "ampteach", "benchmarks"):
        path = ROOT / folder
        assert path.is_dir(), folder
        has_content = any(p.suffix in {".py", ".ipynb"} for p in path.iterdir())
        assert has_content or (path / "README.md").is_file(), f"{folder}/ is empty and has no README.md"


def test_names_shared_with_their_module_stay_the_function_or_class():
    import ampteach.amp.autocast  # noqa: F401  (importing a submodule must not shadow the name)
    import ampteach.training.train  # noqa: F401
    from ampteach import autocast, train

    assert callable(train) and train.__module__ == "ampteach.training.train"
    assert isinstance(autocast, type) and autocast.__module__ == "ampteach.amp.autocast"
