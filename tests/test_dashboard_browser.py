"""The dashboard in a real browser: headless Chromium (Debian's chromium + chromium-driver) through Selenium,
against `ddpsweep serve` over a store written by a real sweep. Screenshots go to $DDPSWEEP_SCREENSHOTS
(default: a temporary folder). Skipped, with the reason, where Chromium or Selenium is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from results.analysis import cells as analysis
from results.storage.store import Store, load
from tests.ray_head import free_port

pytestmark = [pytest.mark.browser, pytest.mark.ray]
ROOT = Path(__file__).resolve().parent.parent
CHROMEDRIVER = shutil.which("chromedriver")

if CHROMEDRIVER is None or shutil.which("chromium") is None:
    pytest.skip(
        "needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)",
        allow_module_level=True,
    )
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install selenium)")


@pytest.fixture(scope="module")
def store_dir(smoke_run, tmp_path_factory) -> str:
    """A copy of the store the session's smoke sweep wrote (a real sweep on the embedded Ray: 2 workers, 3
    buckets, gas 1 and 2, no_sync both ways, 3 rounds; cluster `ci`) and a second, derived cluster."""
    assert smoke_run.returncode == 0, smoke_run.err[-3000:]
    root = tmp_path_factory.mktemp("dash") / "store"
    shutil.copytree(smoke_run.root, root)
    store = Store.open(str(root))
    for row in store.read_table().to_pylist():  # a second cluster 20% faster, for the compare page
        store.write_row(
            row
            | {
                "cluster": "faster",
                "step_ms": row["step_ms"] * 0.8,
                "step_times_ms": [t * 0.8 for t in row["step_times_ms"] or []],
            }
        )
    return str(root)


def serving(store: str):
    """`ddpsweep serve` over `store` on a free loopback port until the generator is closed; yields its URL."""
    import httpx

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--results", store],
        cwd=ROOT,
        env={**os.environ, "DDPSWEEP_TOKEN": "t"},
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(f"{base}/openapi.json", timeout=2)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield base
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(store_dir):
    yield from serving(store_dir)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    profile = tmp_path_factory.mktemp("chromium-profile")  # its own profile: a stray Chromium never blocks it
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1300,1000",
        f"--user-data-dir={profile}",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
    ):
        opts.add_argument(arg)
    opts.binary_location = shutil.which("chromium")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


def shots() -> Path:
    folder = Path(os.environ.get("DDPSWEEP_SCREENSHOTS") or Path(os.environ.get("TMPDIR", "/tmp")) / "ddpsweep-shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def wait_for(predicate, timeout: float = 20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError("timed out waiting for the page")


def no_console_errors(driver) -> None:
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]
    assert severe == []


def test_the_sweeps_page_lists_the_store_and_updates_itself(browser, server, store_dir):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    rows = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#sweeps tr"))
    by_cluster = {r.find_elements(By.TAG_NAME, "td")[0].text: r for r in rows}
    assert set(by_cluster) == {"ci", "faster"}
    written = by_cluster["ci"].find_element(By.CLASS_NAME, "written").text
    stored = load(store_dir, cluster="ci")
    assert written == f"{len(stored)}/{len(stored)}"  # written / planned, as the store holds them
    browser.save_screenshot(str(shots() / "sweeps.png"))
    store = Store.open(store_dir)
    live = {"sweep_id": "live-1", "cell_id": "live", "cluster": "live"}  # its own cluster: the compare test pools
    store.write_row(store.read_table(cluster="ci").to_pylist()[0] | live)  # ci's sweeps, and must not see it
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#sweeps tr[data-sweep='live-1']"))  # no reload
    no_console_errors(browser)


def test_the_sweep_page_draws_the_stored_medians(browser, server, store_dir):
    from selenium.webdriver.common.by import By

    stored = load(store_dir, cluster="ci")
    sweep = stored["sweep_id"].iloc[0]
    browser.get(f"{server}/ui/sweep/ci/{sweep}")
    points = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#u_curve .point"))
    cells = analysis.with_baseline(stored)
    expected = sorted(cells[cells["mode"] == "ddp"]["step_ms"])
    drawn = sorted(float(p.get_attribute("data-y")) for p in points)
    assert drawn == pytest.approx(expected, rel=1e-5)  # drawn to 6 significant digits
    tip = points[0].find_element(By.TAG_NAME, "title").get_attribute("textContent")
    assert "bucket_cap_mb" in tip and "[" in tip  # hover shows the value and its interval
    assert browser.find_elements(By.CSS_SELECTOR, "#best tr") and browser.find_elements(By.CSS_SELECTOR, "#efficiency")
    browser.save_screenshot(str(shots() / "sweep.png"))
    no_console_errors(browser)


def test_the_compare_page_overlays_two_clusters(browser, server):
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/ui/compare?a=ci&b=faster")
    series = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#compare_curves g.series"))
    names = {s.get_attribute("data-series").split(":")[0] for s in series}
    assert names == {"ci", "faster"}
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#comparison tr th")]
    at = heads.index("ratio") + 1  # b / a
    ratios = [float(td.text) for td in browser.find_elements(By.CSS_SELECTOR, f"#comparison tr td:nth-child({at})")]
    assert ratios and all(abs(r - 0.8) < 0.03 for r in ratios)  # b/a = 0.8 as made (a bootstrap point estimate)
    browser.save_screenshot(str(shots() / "compare.png"))
    no_console_errors(browser)


HOSTILE = "<img src=x onerror=alert(1)>"


@pytest.fixture
def hostile_server(tmp_path):
    """A store whose spec name, cluster folder and a pack's sweep id carry markup that would run if injected."""
    import pyarrow.parquet as pq

    from results.storage.schema import row_table
    from tests.seed_rows import seed_rows

    root = tmp_path / "store"
    store = Store.open(str(root))
    for r in seed_rows(cluster="ok", sweep="s1"):
        store.write_row(r | {"spec_name": HOSTILE})
    folder = root / "cluster=<img src=x onerror=alert(2)>" / "sweep=s2"
    folder.mkdir(parents=True)
    for i, r in enumerate(seed_rows(cluster="<img src=x onerror=alert(2)>", sweep="s2")):
        pq.write_table(row_table(r), folder / f"c{i}-r0.parquet")
    pack = [r | {"sweep_id": "<img src=x onerror=alert(3)>"} for r in seed_rows(cluster="ok")]
    pq.write_table(
        row_table(pack[0]).from_pylist(pack, schema=row_table(pack[0]).schema),
        root / "cluster=ok" / "compacted.parquet",
    )
    yield from serving(str(root))


def test_stored_markup_is_shown_as_text_never_run(browser, hostile_server):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    browser.get(hostile_server + "/")
    rows = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#sweeps tr"))
    time.sleep(2.5)  # one more refresh of the table
    assert browser.find_elements(By.CSS_SELECTOR, "#sweeps img") == []
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 — raises when no dialog opened
    texts = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#sweeps tr")]
    assert any(HOSTILE in t for t in texts)  # the spec name, shown as the text it is
    assert len(rows) >= 1 and not any("alert(3)" in t for t in texts)  # the pack's bad sweep id is skipped
