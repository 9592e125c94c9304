"""The HTML report in a real browser: headless Chromium, driven by Selenium through Debian's chromedriver.

Skipped, with the reason, where Chromium, chromedriver or selenium is missing; `nox -s report_check`
and CI install Chromium from Debian's packages.
"""

import os
import shutil

import pandas as pd
import pytest

os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager reach for the network
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Chromium and chromedriver (Debian: apt-get install chromium chromium-driver)",
)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-quic", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from attnbench.cli import main

    root = tmp_path_factory.mktemp("browser")
    args = ["--impl", "bmm,sdpa_flash,naive,xformers", "--seq", "64,128", "--mask", "none,causal"]
    assert main(["run", *args, "--budget-s", "0.03", "--out", str(root / "run")]) == 0
    assert main(["report", str(root / "run"), "--out", str(root / "report")]) == 0
    return root / "run", root / "report" / "report.html"


def test_report_loads_without_errors_and_every_image_decodes(browser, report):
    run, html = report
    browser.get(html.as_uri())
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0])"
    )
    assert len(images) >= 4 and all(ok for _, ok in images), images
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('#results-table tbody tr')).map(r => r.dataset.status)"
    )
    frame = pd.read_parquet(run / "results.parquet")
    assert sorted(rows) == sorted(frame["status"])
    page = browser.find_element("tag name", "body").text
    for reason in frame[frame.status != "ok"].reason.unique():
        assert reason in page


def test_results_table_sorts_by_a_clicked_column(browser, report):
    _, html = report
    browser.get(html.as_uri())
    headers = browser.find_elements("css selector", "#results-table th")
    index = [h.text for h in headers].index("median_ms")
    headers[index].click()
    values = browser.execute_script(
        f"return Array.from(document.querySelectorAll('#results-table tbody tr'))"
        f".map(r => r.children[{index}].getAttribute('data-value')).filter(v => v !== '').map(Number)"
    )
    assert values == sorted(values) and len(values) >= 4
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
