"""Sphinx configuration of the course website, built by `ampteach site` (see ampteach/tools/website.py).

Offline by design: notebooks are shown with their stored outputs (nothing is executed), there is no
intersphinx, and math is turned into MathML while the site is built, so a page needs no script
from the internet to show a formula.
"""

from __future__ import annotations

import html

from docutils import nodes

project = "ampteach"
html_title = "ampteach"          # `ampteach site` passes the README's title
# No author line: the course names no author, and Sphinx's default ("Author name not set") would show in
# every page's footer as "By Author name not set". The footer's items are dropped below as well.
author = ""
extensions = ["myst_nb"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

# Notebooks: stored outputs only; widget state was replaced by static snapshots before the build.
nb_execution_mode = "off"
nb_ipywidgets_js = {}
nb_merge_streams = True
nb_output_stderr = "show"
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

html_theme = "sphinx_book_theme"
html_context = {"default_mode": "auto"}   # the theme logs an error for an empty mode
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "show_toc_level": 2,
    "footer_content_items": [],          # the theme's default is the author line (see `author` above)
}
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_favicon = "_static/favicon.svg"   # without one the browser asks for /favicon.ico and logs a 404
html_copy_source = False
html_show_sourcelink = False
html_last_updated_fmt = None
html_math_renderer = "mathml"


def _mathml(latex: str, display: str) -> str:
    """LaTeX as MathML (every current browser renders it natively); the TeX source if it cannot be converted."""
    try:
        from latex2mathml.converter import convert
        return convert(latex, display=display)
    except Exception:  # no latex2mathml, or TeX it does not know: show the source rather than fail the build
        return f'<code class="math-source">{html.escape(latex)}</code>'


def _visit_math(self, node):
    self.body.append(f'<span class="math">{_mathml(node.astext(), "inline")}</span>')
    raise nodes.SkipNode


def _visit_displaymath(self, node):
    self.body.append(f'<div class="math-display">{_mathml(node.astext(), "block")}</div>')
    raise nodes.SkipNode


def setup(app):
    app.add_html_math_renderer("mathml", (_visit_math, None), (_visit_displaymath, None))
