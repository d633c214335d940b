"""Shared by tests/test_site.py and tests/test_browser.py: the course site, built once per test run
with the network cut off, and what a page shows (figures, tracebacks, links)."""

from __future__ import annotations

import atexit
import functools
import ipaddress
import shutil
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
# Sphinx's notices about its own future API, raised inside the theme and myst-parser (not this project's code).
SPHINX_NOTICES = pytest.mark.filterwarnings("ignore:.*Check CHANGES for Sphinx API modifications")
bs4 = pytest.importorskip("bs4", reason="the site tests read pages with BeautifulSoup (a dependency of nbconvert)")


@contextmanager
def no_network(attempts: list):
    """Refuse (and record in `attempts`) every connection and name lookup that leaves this machine."""
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def local(host) -> bool:
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return host in ("localhost", "")

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not local(address[0]):
            attempts.append(address)
            raise OSError(f"network cut off by the test: {address}")
        return real_connect(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        if host is not None and not local(host if isinstance(host, str) else host.decode()):
            attempts.append(host)
            raise socket.gaierror(f"network cut off by the test: {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect, socket.getaddrinfo = connect, getaddrinfo
    try:
        yield
    finally:
        socket.socket.connect, socket.getaddrinfo = real_connect, real_getaddrinfo


@functools.cache
def built_site():
    """The course's site, built once per test process from this checkout, offline.

    Returns (site, attempts): ampteach.tools.website.Site and the network accesses the build tried (refused)."""
    pytest.importorskip("myst_nb", reason='the site tools are not installed: pip install -e ".[site]"')
    from ampteach.tools import website as site

    out = Path(tempfile.mkdtemp(prefix="ampteach-site-test-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    attempts: list = []
    with no_network(attempts):
        built = site.build(out / "html", ROOT)
    return built, attempts


def html_pages(out: Path) -> dict[Path, "bs4.BeautifulSoup"]:
    """Every HTML page of a built site, parsed, by path relative to the site's folder."""
    return {p.relative_to(out): bs4.BeautifulSoup(p.read_text(encoding="utf-8"), "html.parser")
            for p in sorted(out.rglob("*.html"))}


def page_of(notebook: Path) -> Path:
    """notebooks/02_x.ipynb -> notebooks/02_x.html"""
    return notebook.with_suffix(".html")


def cell_figures(page) -> list:
    """The images a page's cell outputs show (figures and widget snapshots)."""
    return page.select(".cell_output img")


def broken_cells(page) -> list[str]:
    """Cells that show a traceback, except those tagged raises-exception (their error is the lesson).

    Looks at error outputs (myst-nb's .traceback) and at any output text with a Python traceback in it
    (an error printed to stderr)."""
    broken = []
    for cell in page.select("div.cell"):
        if "tag_raises-exception" in cell.get("class", []):
            continue
        outputs = cell.select(".cell_output")
        if any(o.select(".traceback") or "Traceback (most recent call last)" in o.get_text() for o in outputs):
            source = cell.select_one(".cell_input")
            broken.append(source.get_text()[:200] if source else str(cell)[:200])
    return broken
