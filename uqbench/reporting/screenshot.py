"""``python -m uqbench.reporting.screenshot RUN_DIR OUT.png``: a PNG of the summary that
``report.html`` opens with (the title, the banners and the answers, and for a run over several
models their table and figures), as headless Chromium draws it; the README's picture
(``docs/report.png``) is made this way from a finished run.

The page is rendered afresh from the run folder (`uqbench.reporting.html.render_report`) into a
temporary file, so the picture shows this version's report; the run folder is not written to.
Needs Chromium (Debian: ``apt-get install -y chromium``) and the ``playwright`` package (the
``test`` extra); nothing is downloaded.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from uqbench.core.errors import UserError
from uqbench.reporting.html import render_report

VIEWPORT = {"width": 1400, "height": 900}


def chromium() -> str:
    """The system Chromium's path, else a `UserError` saying how to install it."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise UserError("no Chromium found on PATH: install the system's (Debian/Ubuntu: "
                        "`apt-get install -y chromium`)")
    return exe


def launch(playwright: Any) -> Any:
    """A headless Chromium browser of ``playwright`` (a started `sync_playwright`)."""
    return playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])


def screenshot(run_dir: str | Path, out: str | Path, *, browser: Any = None) -> Path:
    """Write the summary of ``run_dir``'s report as a PNG at ``out``; returns ``out``.
    ``browser``: a Playwright browser to use (else one is launched and closed)."""
    if browser is None:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise UserError("the screenshot needs the playwright package (pip install "
                            "'uqbench[test]'); it drives the system's Chromium") from None
        chromium()  # before rendering: the clear error first
        with sync_playwright() as pw:
            b = launch(pw)
            try:
                return screenshot(run_dir, out, browser=b)
            finally:
                b.close()
    html = render_report(run_dir)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        page_path = Path(tmp) / "report.html"
        page_path.write_text(html)
        page = browser.new_page(viewport=VIEWPORT)
        try:
            page.goto(page_path.as_uri(), wait_until="load")
            # a run over several models opens with them side by side after the summary
            last = "#models-side-by-side" if page.locator("#models-side-by-side").count() \
                else "#summary"
            box = page.locator(last).bounding_box()
            if box is None:
                raise UserError(f"the report of {run_dir} has no summary to draw")
            page.screenshot(path=str(out), full_page=True,
                            clip={"x": 0, "y": 0, "width": VIEWPORT["width"],
                                  "height": box["y"] + box["height"] + 4})
        finally:
            page.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m uqbench.reporting.screenshot",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a finished run folder")
    ap.add_argument("out", help="the PNG to write, e.g. docs/report.png")
    args = ap.parse_args(argv)
    try:
        print(f"wrote {screenshot(args.run_dir, args.out)}")
    except UserError as exc:
        ap.exit(2, f"error: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
