"""The HTML report in a real browser: headless Chromium, driven by Selenium through Debian's chromedriver.

Skipped, with the reason, where Chromium, chromedriver or selenium is missing; `nox -s report_check`
and CI install Chromium from Debian's packages.
"""

import pandas as pd
import pytest

from attnbench.reports.summary import merged_reasons

from conftest import NEEDS_CHROMIUM, Shifted, headless_chromium, stalled_as_ok

pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
pytestmark = NEEDS_CHROMIUM
TABLE = "#results-table"


class Evil(Shifted):
    """A wrong contender (rows `incorrect`) whose name is HTML; importable, so it runs in the worker too."""

    name = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    yield from headless_chromium(tmp_path_factory, 1000)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    import attnbench
    from attnbench.cli import main
    from attnbench.contenders import registry

    attnbench.register(Evil)
    try:
        root = tmp_path_factory.mktemp("browser")
        args = ["--impl", f"bmm,sdpa_flash,naive,xformers,{Evil.name}", "--seq", "64,128", "--mask", "none,causal"]
        assert main(["run", *args, "--budget-s", "0.03", "--out", str(root / "run")]) == 0
        stalled_as_ok(root / "run")  # the filters are tested on every bmm row, whatever the machine did
        assert main(["report", str(root / "run"), "--out", str(root / "report")]) == 0
    finally:
        registry.unregister(Evil.name)
    return pd.read_parquet(root / "run" / "results.parquet"), root / "report" / "report.html"


def _open(browser, html):
    browser.get(html.as_uri())
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 30).until(lambda d: d.find_elements("css selector", f"{TABLE}_wrapper .dtsp-searchPane"))


def _severe(browser):
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def _header_cells(browser):
    """The main table's visible column headings (the filter panes are small tables of their own)."""
    return browser.execute_script(
        f"return Array.from(document.querySelector('{TABLE}').closest('.dt-scroll')"
        ".querySelectorAll('.dt-scroll-head th'))"
    )


def _headers(browser):
    return [h.get_attribute("textContent") for h in _header_cells(browser)]  # also where scrolled out of view


def _show_all_rows(browser):
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("css selector", f"{TABLE}_wrapper .dt-length select")).select_by_visible_text("All")


def _column(browser, name):
    index = _headers(browser).index(name)
    return browser.execute_script(
        f"return Array.from(document.querySelectorAll('{TABLE} tbody tr'))"
        f".map(r => r.children[{index}] ? r.children[{index}].textContent : null)"
    )


def _pick(browser, pane, value):
    """Click ``value`` in the filter pane of column ``pane`` (panes redraw asynchronously: wait for it, and look
    again when a redraw replaced the element between finding and using it)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def entry(_):
        for container in browser.find_elements("css selector", f"{TABLE}_wrapper div.dtsp-searchPane"):
            placeholders = container.find_elements("css selector", "input.dtsp-paneInputButton")
            if placeholders and placeholders[0].get_attribute("placeholder") == pane:
                for name in container.find_elements("css selector", "span.dtsp-name"):
                    if name.get_attribute("textContent") == value:
                        return name
        return False

    stale = (StaleElementReferenceException,)
    for attempt in range(3):
        name = WebDriverWait(browser, 10, ignored_exceptions=stale).until(entry, f"no {value!r} in the {pane} pane")
        try:
            browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", name)
            name.click()
            return
        except StaleElementReferenceException:
            if attempt == 2:
                raise


def test_report_loads_without_errors_offline_and_every_row_is_in_the_table(browser, report):
    frame, html = report
    _open(browser, html)
    assert _severe(browser) == []
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0])"
    )
    assert len(images) >= 4 and all(ok for _, ok in images), images
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(url.startswith(("data:", "blob:", "file:")) for url in fetched), fetched  # nothing from a network
    assert len(browser.find_elements("css selector", f"{TABLE} tbody tr")) == 25  # one page
    _show_all_rows(browser)
    assert sorted(_column(browser, "status")) == sorted(frame["status"])
    assert sorted(_column(browser, "impl")) == sorted(frame["impl"])  # the HTML name shows as text
    assert "median_ms" in _headers(browser) and "iqr_ms" not in _headers(browser)  # default columns
    page = browser.find_element("tag name", "body").text
    for reason in merged_reasons(frame[frame.status != "ok"]).unique():  # as "Why points are missing" says them
        assert reason in page
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):  # the contender's name never ran as a script
        _ = browser.switch_to.alert


def test_filter_by_contender_and_status_shows_exactly_those_rows(browser, report):
    from selenium.webdriver.support.ui import WebDriverWait

    frame, html = report
    _open(browser, html)
    _show_all_rows(browser)
    for impl, status in (("bmm", "ok"), (Evil.name, "incorrect")):
        browser.find_element("css selector", f"{TABLE}_wrapper button.dtsp-clearAll").click()
        _pick(browser, "impl", impl)
        _pick(browser, "status", status)
        expected = frame[(frame.impl == impl) & (frame.status == status)]
        assert len(expected) >= 4
        count = len(expected)
        WebDriverWait(browser, 10).until(lambda _, count=count: len(_column(browser, "impl")) == count)
        assert _column(browser, "impl") == [impl] * len(expected)
        assert _column(browser, "status") == [status] * len(expected)
        shown = sorted(zip(_column(browser, "shape"), _column(browser, "mask"), strict=True))
        assert len(shown) == len(expected) and len(set(shown)) == len(expected)
    assert _severe(browser) == []


def test_sort_a_column_and_show_a_hidden_one(browser, report):
    _, html = report
    _open(browser, html)
    from selenium.webdriver.support.ui import WebDriverWait

    (median,) = [h for h in _header_cells(browser) if h.get_attribute("textContent") == "median_ms"]
    median.click()
    WebDriverWait(browser, 10).until(lambda _: "dt-ordering-asc" in median.get_attribute("class"))  # drawn async
    values = [float(v) for v in _column(browser, "median_ms") if v]
    assert values == sorted(values) and len(values) >= 10
    assert "iqr_ms" not in _headers(browser)
    browser.find_element("css selector", f"{TABLE}_wrapper button.buttons-colvis").click()
    (entry,) = [b for b in browser.find_elements("css selector", ".dt-button-collection button") if b.text == "iqr_ms"]
    entry.click()
    WebDriverWait(browser, 10).until(lambda _: "iqr_ms" in _headers(browser))
    assert any(v for v in _column(browser, "iqr_ms"))
    assert _severe(browser) == []


def test_in_a_narrow_window_figures_keep_readable_labels_and_no_page_scrolls_sideways(browser, report, tmp_path):
    """At 800 pixels the figures shrank to 43 % of their size (labels of 4 pixels, unreadable) and compare.html's
    table ran past the window's edge. A figure now keeps 3/4 of its size and scrolls in its own box; the page does
    not scroll sideways, compare's table scrolls in its own."""
    from attnbench.cli import main

    _, html = report
    assert main(
        ["compare", str(html.parent.parent / "run"), str(html.parent.parent / "run"), "--out", str(tmp_path)]
    ) in (0, 1)
    browser.set_window_size(800, 1000)
    try:
        _open(browser, html)
        sizes = browser.execute_script(
            "return Array.from(document.querySelectorAll('figure img'))"
            ".map(i => [i.alt, i.getBoundingClientRect().width, i.naturalWidth])"
        )
        assert sizes and all(width >= min(natural, 0.75 * natural - 1) for _, width, natural in sizes), sizes
        assert any(width < natural for _, width, natural in sizes)  # a figure wider than the window still shrinks
        for page in (html, tmp_path / "compare.html"):
            browser.get(page.as_uri())
            wide = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
            assert wide[0] <= wide[1], (page.name, wide)
    finally:
        browser.set_window_size(1400, 1000)


def test_printed_the_page_drops_the_tables_controls_and_fits_its_figures_to_the_paper(browser, report):
    """On paper the filter panes, buttons, search box and pager printed as empty boxes, and a figure kept its screen
    minimum width (wider than the sheet: cut at its edge)."""
    _, html = report
    browser.set_window_size(800, 1000)
    try:
        _open(browser, html)
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
        shown = browser.execute_script(
            f"return ['.dtsp-panesContainer', '.dt-buttons', '.dt-search', '.dt-paging', '.dt-length']"
            f".map(s => document.querySelector('{TABLE}_wrapper ' + s))"
            ".filter(e => e && getComputedStyle(e).display !== 'none').map(e => e.className)"
        )
        assert shown == []
        widths = browser.execute_script(
            "return Array.from(document.querySelectorAll('figure img'))"
            ".map(i => [i.getBoundingClientRect().width, i.parentElement.getBoundingClientRect().width])"
        )
        assert widths and all(image <= figure + 3 for image, figure in widths), widths  # + its border
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})
        browser.set_window_size(1400, 1000)


def test_printed_the_results_table_has_every_row_the_filters_keep_not_only_the_screens_page(browser, report):
    """The pager is not printed, so a printed or saved-as-PDF report held the first page of rows (25) and lost the
    rest; on paper every filtered row is there, and the screen's page length is back after printing."""
    frame, html = report
    _open(browser, html)
    count = f"return document.querySelectorAll('{TABLE} tbody tr').length"
    screen = browser.execute_script(count)
    assert screen < len(frame), "the report needs more rows than one page to show the loss"
    browser.execute_script("window.dispatchEvent(new Event('beforeprint'))")
    assert browser.execute_script(count) == len(frame)
    browser.execute_script("window.dispatchEvent(new Event('afterprint'))")
    assert browser.execute_script(count) == screen
