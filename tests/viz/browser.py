"""A page opened in a real browser (Chromium, driven by Playwright) for the explorers' tests: skipped,
with the reason, where either is missing; the console's errors collected, and none allowed; a
screenshot of the page kept under the test artifacts."""

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ARTIFACTS = Path(os.environ.get("ATTNKIT_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))


def chromium() -> str | None:
    return next(
        (p for name in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(name))), None
    )


@contextlib.contextmanager
def opened_in_chromium(page_file: Path, screenshot: str) -> Iterator:
    """``page_file`` open in Chromium (a 1400×1000 window): the Playwright page; on leaving, its
    screenshot is saved as ``screenshot`` and no script error may have been logged."""
    playwright = pytest.importorskip("playwright.sync_api", reason="Playwright drives the browser")
    browser_path = chromium()
    if browser_path is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium; .ci/run does)")
    errors = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(page_file.as_uri())
        yield page
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / screenshot), full_page=True)
        browser.close()
    assert errors == []
