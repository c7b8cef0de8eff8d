#!/usr/bin/python3
"""The console page in a real browser (headless Chromium through Selenium).

Starts graphs/pretrain.graph (stories260K, two ZeRO ranks) with the console on a
free port, opens the page with the token the run printed, waits until a node is
drawn busy and an edge shows a non-zero rate, clicks the ZeRO ranks and checks
their detail (settings, counters, replicas, memory), expands the replica group,
checks the Cluster panel (main alone, with every replica), waits for the loss chart, saves a screenshot into OUT and prints its path, then
stops the run from the page's Stop button.

usage: console_browser.py FLOWRUN ROOT OUT
Needs Debian's chromium, chromium-driver and python3-selenium (tools/setup.sh).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

flowrun, root, out = sys.argv[1:4]
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from selenium.common.exceptions import StaleElementReferenceException
except ImportError as e:
    sys.exit(f"console_browser: {e}: install python3-selenium (tools/setup.sh) and run with /usr/bin/python3")
chromium = shutil.which("chromium") or shutil.which("chromium-browser")
chromedriver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not chromium or not os.path.exists(chromedriver):
    sys.exit("console_browser: chromium and chromium-driver are needed (tools/setup.sh installs them)")

ck = os.path.join(out, "ck")
err_path = os.path.join(out, "flowrun.err")
err = open(err_path, "w")
run = subprocess.Popen(
    [flowrun, "run", os.path.join(root, "graphs/pretrain.graph"), "--no-progress", "-q", "--threads", "2",
     "--console", "0",
     "--set", "node.data.total_steps=100000", "--set", "node.ranks.total_steps=100000",
     "--set", f"node.ranks.output_dir={ck}", "--set", f"node.data.output_dir={ck}",
     "--set", "node.ranks.save_checkpoint_steps=0", "--set", "node.ranks.export_hf=",
     "--set", "node.ranks.print_every=100000"],
    stdout=subprocess.DEVNULL, stderr=err)


def retry(fn, tries=20):
    """The page redraws its SVG every frame, so an element found by one WebDriver call can be
    replaced before the next call uses it (StaleElementReferenceException): find and use it again."""
    for i in range(tries):
        try:
            return fn()
        except StaleElementReferenceException:
            if i == tries - 1:
                raise
            time.sleep(0.1)


def fail(msg):
    print("console_browser: FAILED:", msg)
    run.kill()
    with open(err_path) as f:
        print(f.read()[-3000:])
    sys.exit(1)


# The address and token flowrun prints: "console: http://127.0.0.1:PORT/ (token T; ...)"
url = token = None
for _ in range(600):
    with open(err_path) as f:
        m = re.search(r"console: (http://127\.0\.0\.1:\d+/) \(token ([0-9a-f]+);", f.read())
    if m:
        url, token = m.group(1), m.group(2)
        break
    if run.poll() is not None:
        fail("flowrun exited before its console started")
    time.sleep(0.1)
if not url:
    fail("flowrun printed no console address")
print("console at", url)

opts = Options()
opts.binary_location = chromium
for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1600,1500",
          "--no-first-run", "--disable-extensions", f"--user-data-dir={os.path.join(out, 'chrome-profile')}"):
    opts.add_argument(a)
driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=opts)
shot = os.path.join(out, "console.png")
try:
    driver.get(url + "?token=" + token)
    wait = WebDriverWait(driver, 90, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException])
    assert driver.title.startswith("flowrun"), driver.title

    # the graph is drawn: both nodes, one edge
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#graph g.node")) == 2)
    assert driver.find_elements(By.CSS_SELECTOR, '#graph g.node[data-node="ranks"]')
    assert driver.find_elements(By.CSS_SELECTOR, '#graph g.edge[data-edge="data.batch -> ranks.batch"]')

    # nodes turn busy and rates become non-zero
    def busy_and_flowing(d):
        return d.execute_script("""
            const busy = document.querySelectorAll('#graph g.node.state-busy').length;
            const rates = [...document.querySelectorAll('#graph text.edge-label')]
                .map(t => parseFloat(t.getAttribute('data-msgs-per-s')) || 0);
            return busy > 0 && rates.some(r => r > 0) ? {busy: busy, rates: rates} : null;""")
    seen = wait.until(busy_and_flowing)
    print("busy nodes:", seen["busy"], "edge rates (msg/s):", seen["rates"])
    label = retry(lambda: driver.find_element(By.CSS_SELECTOR, "#graph text.edge-label").text)
    assert "msg/s" in label, label
    print("edge label:", label)
    assert retry(lambda: driver.find_element(By.ID, "run-state").text).startswith("running")

    # click the ZeRO ranks: their detail shows settings, counters, replicas and memory
    retry(lambda: driver.find_element(By.CSS_SELECTOR, '#graph g.node[data-node="ranks"] rect.box').click())
    # (the panel refreshes itself every 1.5 s: read it in one script call)
    def detail_of_ranks(d):
        return d.execute_script("""
            const d = document.getElementById('detail');
            if (d.getAttribute('data-node') !== 'ranks' || !d.querySelector('table.settings')) return null;
            const rows = [...d.querySelectorAll('table.settings tr')].slice(1)
                .map(r => [...r.children].map(c => c.textContent));
            const st = d.querySelector('.detail-state');
            return {text: d.innerText, settings: rows, state: st ? st.textContent : ''};""")
    info = wait.until(detail_of_ranks)
    text = info["text"].lower()  # headings are shown in capitals
    for want in ("ranks", "zero_rank", "deepspeed_config", "zero_stage", "messages in", "replicas", "memory",
                 "recent errors", "data.batch -> ranks.batch", "signal loss"):
        assert want in text, f"the detail lacks {want!r}:\n{info['text']}"
    settings = dict(info["settings"])
    assert settings.get("seq_length", "").startswith("64"), settings
    assert settings.get("zero_stage", "").startswith("-1"), settings
    state = info["state"]
    assert state in ("busy", "idle", "waiting credit", "waiting request"), state
    assert "selected" in retry(lambda: driver.find_element(
        By.CSS_SELECTOR, '#graph g.node[data-node="ranks"]').get_attribute("class"))
    print("detail of ranks:", state, "| settings:", ", ".join(f"{k}={v}" for k, v in list(settings.items())[:6]), "...")

    # the replica group expands into its two ranks
    retry(lambda: driver.find_element(By.CSS_SELECTOR, '#graph g.toggle[data-toggle="ranks"] rect').click())
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, '#graph g.node[data-node="ranks"] rect.replica')) == 2)

    # charts of the training signals, the bottleneck panel, memory per rank, the event log
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#charts .chart[data-series="ranks/loss"] polyline'))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#bottlenecks li"))
    wait.until(lambda d: "ranks[1]" in retry(lambda: d.find_element(By.ID, "memory").text))
    assert driver.find_elements(By.CSS_SELECTOR, '#events li[data-kind="spawn"]')
    # the Cluster panel: one process, so a single row, main, holding every replica
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#cluster tr.local"))
    row = retry(lambda: driver.find_element(By.CSS_SELECTOR, "#cluster tr.local").text)
    assert row.startswith("main") and "ranks[0]" in row and "ranks[1]" in row, row
    assert "One process" in retry(lambda: driver.find_element(By.ID, "cluster").text)
    top = retry(lambda: driver.find_element(By.CSS_SELECTOR, "#bottlenecks li").get_attribute("data-node"))
    print("top bottleneck:", top, "| charts:",
          retry(lambda: [c.get_attribute("data-series") for c in driver.find_elements(By.CSS_SELECTOR, "#charts .chart")]))
    time.sleep(1.5)  # one more frame so the screenshot shows fresh rates
    driver.save_screenshot(shot)
    print("screenshot:", shot)

    # Stop from the page (confirm() answered yes)
    driver.execute_script("window.confirm = () => true;")
    retry(lambda: driver.find_element(By.ID, "btn-stop").click())
    try:
        rc = run.wait(timeout=60)
    except subprocess.TimeoutExpired:
        fail("the run did not stop after the page's Stop")
    if rc != 130:
        fail(f"flowrun exited with {rc} after Stop (expected 130)")
    print("stopped from the page: flowrun exit code", rc)
except Exception as e:  # keep a screenshot of what the page showed
    try:
        driver.save_screenshot(os.path.join(out, "failure.png"))
        print("page at failure:", os.path.join(out, "failure.png"))
        print(driver.find_element(By.TAG_NAME, "body").text[:3000])
        for entry in driver.get_log("browser")[-20:]:
            print("browser log:", entry)
    except Exception:
        pass
    fail(f"{type(e).__name__}: {e}")
finally:
    driver.quit()
    shutil.rmtree(os.path.join(out, "chrome-profile"), ignore_errors=True)
    if run.poll() is None:
        run.kill()
print("console_browser: ok")
