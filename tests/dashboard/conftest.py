"""Dashboard fixtures: a results DB with a baseline run and the sample run, and headless Chromium."""

from __future__ import annotations

import os

import pytest

from tests.results import samples

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def sample_db(tmp_path):
    return samples.write_sample_db(tmp_path, devices="cpu")


def in_ci() -> bool:
    """CI sets CI (GitHub, GitLab, Buildkite do; .ci/run exports it): there a missing browser is a
    failure, or CI would go green without the dashboard's XSS and link tests."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        why = f"{CHROMIUM} not installed (apt-get install chromium): browser tests need a real Chromium"
        if in_ci():
            pytest.fail(f"{why}; in CI that is a failure, not a skip", pytrace=False)
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A page that records dialogs (any = an XSS fired), page errors and every network request."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.dialogs, pg.errors, pg.requests = [], [], []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("request", lambda r: pg.requests.append(r.url))
    yield pg
    context.close()
