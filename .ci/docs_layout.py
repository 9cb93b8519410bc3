"""The built site at a browser's width: every table and code block fits.

Run by hand after changing docs/ (it needs Chromium and Playwright, which CI
does not install):

    pip install ".[docs]" playwright && mkdocs build --strict --site-dir site
    python .ci/docs_layout.py site --width 1280 --shots site-shots

Each page is opened from disk (file://, as a reader opens the built site)
in headless Chromium; a table, a code block or the page itself wider than
its box is named, with by how many pixels. --shots keeps a screenshot of
each page's first screen. Exits 1 when anything overflows.
"""
import argparse
import pathlib
import shutil
import sys

OVERFLOW = """() => {
  const found = [];
  for (const box of document.querySelectorAll(
      'article table, article pre, article pre > code, article .md-typeset__scrollwrap')) {
    if (box.scrollWidth > box.clientWidth + 1) {
      found.push(`${box.tagName} ${box.scrollWidth - box.clientWidth} px: ` +
                 box.innerText.slice(0, 60).replace(/\\s+/g, ' '));
    }
  }
  return {page: document.documentElement.scrollWidth, found: found};
}"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=pathlib.Path, help="the folder mkdocs built")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--shots", type=pathlib.Path, help="a folder for screenshots")
    options = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    browser_path = shutil.which("chromium") or shutil.which("chromium-browser")
    pages = sorted(options.site.glob("*.html"))
    if not pages:
        parser.error(f"no .html pages in {options.site}: build the site first")
    wide = 0
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_path,
                                             args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": options.width, "height": 900})
        for html in pages:
            page.goto(html.resolve().as_uri())
            measured = page.evaluate(OVERFLOW)
            if measured["found"] or measured["page"] > options.width:
                wide += 1
                print(f"{html.name}: page {measured['page']} px; " +
                      "; ".join(measured["found"]))
            if options.shots:
                options.shots.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(options.shots / f"{html.stem}.png"))
        browser.close()
    print(f"{len(pages)} pages at {options.width} px: {wide} wider than their boxes")
    return 1 if wide else 0


if __name__ == "__main__":
    sys.exit(main())
