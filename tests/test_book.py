"""The Jupyter Book builds without warnings, and its pages work in a real browser.

The build runs `jupyter-book build . -W` (warnings are errors; the notebooks are not executed, their
stored outputs are rendered). Set BOOK_BUILT=1 to reuse a fresh `_build/html` instead.

The browser part opens every chapter in headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by selenium) through a localhost http.server and checks that the page loads, that its figures are
decoded images of non-zero size, that math is typeset by MathJax (served from the book itself, so no
network is needed), and that every internal link points at an existing file and anchor. Full-page
screenshots of the chapters in SHOT_PAGES go to _build/screenshots/ for a reviewer. Without chromium the
browser tests are skipped with the reason (the GPU host has none; CI installs
`apt-get install -y chromium chromium-driver`).
"""
from __future__ import annotations

import base64
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
SHOT_PAGES = ("book/intro", "book/v4", "book/v5", "book/v6", "book/results")   # full-page screenshots
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and Path(p).exists()), None)
DRIVER = next((p for p in (shutil.which("chromedriver"), "/usr/bin/chromedriver") if p and Path(p).exists()), None)


def toc_pages() -> list[str]:
    return re.findall(r"(?:root|file):\s*(\S+)", (ROOT / "_toc.yml").read_text())


@pytest.fixture(scope="module")
def built() -> Path:
    """_build/html, built now with -W unless BOOK_BUILT=1 says it is fresh."""
    if os.environ.get("BOOK_BUILT") == "1":
        if not (HTML / "index.html").exists():
            pytest.fail("BOOK_BUILT=1 but _build/html/index.html does not exist")
        return HTML
    pytest.importorskip("jupyter_book", reason="jupyter-book<2 is not installed")
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe)] if exe.exists() else [shutil.which("jupyter-book") or "jupyter-book"]
    proc = subprocess.run(cmd + ["build", str(ROOT), "-W", "-n"], capture_output=True, text=True, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, "jupyter-book build -W failed:\n" + "\n".join(out.splitlines()[-40:])
    assert "WARNING" not in out, "\n".join(l for l in out.splitlines() if "WARNING" in l)
    return HTML


def test_every_chapter_is_built(built):
    for page in toc_pages():
        assert (built / f"{page}.html").exists(), f"{page} was not built"
    # nothing outside the table of contents became a page
    stray = [p for p in built.rglob("*.html") if p.parent.name in ("kernels", "scripts", "results", "tests", "docs")]
    assert not stray and not (built / "README.html").exists() and not (built / "CONTRIBUTING.html").exists()


def test_nbval_options_are_cell_tags(built):
    """nbval's options live in cell metadata (tags), so a reader sees only the code: no comment marker in a
    code cell, and nothing of the tag in the text of a rendered page (myst-nb turns it into a CSS class)."""
    nbformat = pytest.importorskip("nbformat")
    plugin = pytest.importorskip("nbval.plugin")
    tagged = 0
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            comments = {line.strip().lstrip("#").strip() for line in cell.source.splitlines()
                        if line.strip().startswith("#")}
            assert not comments & set(plugin.comment_markers), \
                f"{path.name}: nbval comment marker in {cell.source[:60]!r}; use a cell tag"
            tags = cell.metadata.get("tags", [])
            unknown = [t for t in tags if t.startswith("nbval") and t not in plugin.metadata_tags]
            assert not unknown, f"{path.name}: nbval does not know the tag(s) {unknown}"
            tagged += "nbval-check-output" in tags
    assert tagged, "no cell carries the nbval-check-output tag: nbval --nbval-lax would check nothing"
    for page in built.rglob("*.html"):
        text = re.sub(r"<[^>]+>", " ", re.sub(r"<script.*?</script>", " ", page.read_text(), flags=re.S))
        assert "nbval-check-output" not in text and "NBVAL_" not in text, f"{page.name} shows an nbval marker"


def test_math_is_served_locally(built):
    """MathJax must come with the book (sphinx-mathjax-offline); a CDN would leave pages blank offline."""
    page = (built / "book" / "online_softmax.html").read_text()
    src = re.findall(r'<script[^>]+src="([^"]*(?:mathjax|MathJax)[^"]*)"', page)
    assert src, "no MathJax script on a page full of math"
    if any(s.startswith("http") for s in src):
        pytest.skip("sphinx-mathjax-offline is not installed: the book loads MathJax from a CDN")
    assert (built / "book" / src[0].split("?")[0]).resolve().exists()


# ------------------------------------------------------------------------------------------ browser
class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(built):
    handler = functools.partial(_Quiet, directory=str(built))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("chromium and chromium-driver are not installed (apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.service import Service
    profile = tempfile.mkdtemp(prefix="book-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", "--window-size=1280,1600"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _wait(driver, script: str, timeout: float = 30.0):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: d.execute_script(script))


def _stored_figures(page: str) -> int:
    """PNG outputs stored in the notebook behind a page (0 for markdown pages)."""
    path = ROOT / f"{page}.ipynb"
    if not path.exists():
        return 0
    import nbformat
    book = nbformat.read(path, as_version=4)
    return sum(1 for c in book.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if "image/png" in o.get("data", {}))


class _Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("id", "name") and v:
                self.ids.add(v)


@functools.cache
def _ids_of(path: Path) -> frozenset:
    p = _Ids()
    p.feed(path.read_text(errors="replace"))
    return frozenset(p.ids)


@pytest.mark.parametrize("page", toc_pages())
def test_page_in_browser(page, browser, server, built):
    url = urljoin(server, f"{page}.html")
    browser.get(url)
    _wait(browser, "return document.readyState === 'complete'")
    assert browser.title and "404" not in browser.title
    assert browser.find_elements("css selector", "article, main"), "no main content"

    # figures: every image in the page content is decoded and has a size
    want = _stored_figures(page)
    if want:
        _wait(browser, "return Array.from(document.querySelectorAll('.cell_output img')).every(i => i.complete)")
    imgs = browser.execute_script(
        "return Array.from(document.querySelectorAll('article img, main img')).map("
        "i => [i.getAttribute('src'), i.naturalWidth, i.naturalHeight, i.closest('.cell_output') !== null])")
    figures = [i for i in imgs if i[3]]
    assert len(figures) >= want, f"{page}: {want} figures stored, {len(figures)} shown"
    broken = [i[0] for i in imgs if not (i[1] > 0 and i[2] > 0)]
    assert not broken, f"{page}: images not decoded: {broken}"

    # math: pages with math source get MathJax output elements
    has_math = browser.execute_script("return document.querySelectorAll('.math, div.math, span.math').length")
    if has_math:
        try:
            _wait(browser, "return document.querySelectorAll('mjx-container').length > 0", timeout=40)
        except Exception as err:
            src = browser.execute_script(
                "return Array.from(document.scripts).map(s => s.src).filter(s => /mathjax/i.test(s))")
            if any(not s.startswith(server) for s in src):
                pytest.skip(f"{page}: MathJax comes from a CDN and there is no network")
            raise AssertionError(f"{page}: {has_math} math elements but MathJax rendered none") from err
        assert not browser.find_elements("css selector", "mjx-merror"), f"{page}: MathJax reported a TeX error"

    # internal links: the target file exists and so does the #anchor
    hrefs = browser.execute_script("return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
    bad = []
    for href in set(hrefs):
        u = urlparse(href)
        if not href.startswith(server):
            continue
        target = built / unquote(u.path[len(urlparse(server).path):])
        if target.is_dir():
            target = target / "index.html"
        if not target.exists():
            bad.append(href)
        elif u.fragment and target.suffix == ".html" and unquote(u.fragment) not in _ids_of(target):
            bad.append(href)
    assert not bad, f"{page}: broken internal links: {sorted(bad)}"

    if page in SHOT_PAGES:                      # the whole page, as a reader scrolls through it
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / f"{page.split('/')[-1]}.png"
        w, h = browser.execute_script("return [document.documentElement.scrollWidth, "
                                      "document.documentElement.scrollHeight]")
        png = browser.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": w, "height": h, "scale": 1}})
        shot.write_bytes(base64.b64decode(png["data"]))
        assert shot.stat().st_size > 10_000
