"""Two small Sphinx tweaks for the book (registered in _config.yml as a local extension).

* MathJax 3 is served from the built book instead of a CDN, so that pages render math offline and in the
  headless-browser test, which has no network. The files come from the PyPI package
  `sphinx-mathjax-offline` (a requirement of the book; its folder name has dashes, hence importlib).
  Without it the book keeps Sphinx's CDN default.
* `literalinclude` with `:diff:` labels the two files with their absolute paths on the machine that built
  the book; the labels are rewritten relative to the repository root.
"""
import importlib
import logging
from pathlib import Path

from docutils import nodes

logger = logging.getLogger(__name__)


def _relative_diff_labels(app, doctree):
    root = str(Path(app.srcdir).resolve()) + "/"
    for block in doctree.findall(nodes.literal_block):
        text = block.astext()
        if block.get("language") not in ("udiff", "diff") or root not in text[:1000]:
            continue
        head, sep, rest = text.partition("@@")
        block.children = [nodes.Text(head.replace(root, "") + sep + rest)]
        block.rawsource = block.astext()


def setup(app):
    app.connect("doctree-read", _relative_diff_labels)
    try:
        offline = importlib.import_module("sphinx-mathjax-offline")
    except ImportError:
        logger.info("sphinx-mathjax-offline is not installed: MathJax is loaded from its CDN")
    else:
        offline.setup(app)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
