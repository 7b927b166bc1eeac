"""The web console in a real browser (headless Chromium driven by Selenium) against a real
cluster over TLS: a coordinator serving the console (--console-listen, --console-tokens), an
aggregator and two peers of this build on 127.0.0.1 port 0. Logs in with a token; the task
created with shoalctl is in the list; once the peers start, its accuracy curve grows as its
rounds complete (the event stream, no reload); a bad task file shows the coordinator's message; a task created from
the page trains; a request without credential is refused. Writes a screenshot of each page.

Usage: /usr/bin/python3 console_browser_test.py SOURCE_DIR BIN_DIR [SCREENSHOT_DIR]
(Debian's chromium, chromium-driver and python3-selenium: scripts/bootstrap test).
"""

import json
import os
import ssl
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

SOURCE, BIN = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
SHOTS = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else None
os.environ["BUILD_DIR"] = os.path.dirname(BIN)
sys.path[:0] = [os.path.join(SOURCE, "scripts", "lib")]

import shoal_cluster  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import NoSuchElementException  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ADMIN = "admin-browser-token-0123456789"
VIEWER = "viewer-browser-token-0123456789"
TASK = """\
name: {name}
mode: federated-sync
model: mlp
dataset:
  partition: iid
  train_limit: 3000
  test_limit: 500
round_batches: 5
rounds: {rounds}
min_participants: 2
round_deadline_seconds: 20
seed: 7
"""


class ConsoleBrowserTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.started = time.monotonic()
        cls.work = tempfile.TemporaryDirectory(prefix="shoal-console-browser-")
        work = cls.work.name
        cls.shots = SHOTS or os.path.join(work, "screenshots")
        os.makedirs(cls.shots, exist_ok=True)
        tokens = os.path.join(work, "console-tokens")
        with open(tokens, "w") as f:
            f.write(f"admin {ADMIN}\nviewer {VIEWER}\n")
        cls.cluster = shoal_cluster.Cluster("console_browser_test", work,
                                            tls_dir=os.path.join(work, "certs"))
        cls.driver = None
        try:
            cls.cluster.start_coordinator(["--console-listen", "127.0.0.1:0",
                                           "--console-tokens", tokens])
            cls.url = "https://" + cls.cluster.addresses["coordinator"]["console"] + "/"
            cls.cluster.start_aggregator()
            task = os.path.join(work, "first.yaml")
            with open(task, "w") as f:
                f.write(TASK.format(name="first", rounds=3))
            cls.cluster.shoalctl("task", "create", task)
            options = webdriver.ChromeOptions()
            options.binary_location = "/usr/bin/chromium"
            for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                        "--disable-gpu", "--window-size=1200,1100", "--ignore-certificate-errors",
                        "--force-device-scale-factor=0.8"):
                options.add_argument(arg)
            cls.driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"),
                                          options=options)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.driver is not None:
            cls.driver.quit()
        cls.cluster.stop()
        cls.work.cleanup()
        print(f"console_browser_test: {time.monotonic() - cls.started:.1f} s", file=sys.stderr)

    def wait(self, condition, what, timeout=30):
        try:
            # The task page redraws at every status: an element found may go stale at once.
            return WebDriverWait(self.driver, timeout, poll_frequency=0.1,
                                 ignored_exceptions=(NoSuchElementException,
                                                     StaleElementReferenceException)).until(
                lambda d: condition(d), message=f"waiting for {what}")
        except Exception:
            self.shot("failure")
            print(self.driver.find_element(By.TAG_NAME, "body").text, file=sys.stderr)
            for entry in self.driver.get_log("browser"):
                print("browser:", entry, file=sys.stderr)
            raise

    def shot(self, name, whole=False):
        """Saves a screenshot of the window, or with `whole` of the whole page (up to 2400
        pixels high)."""
        if whole:
            height = self.driver.execute_script("return document.body.scrollHeight;")
            self.driver.set_window_size(1200, min(2400, height + 160))
        self.driver.save_screenshot(os.path.join(self.shots, name + ".png"))
        if whole:
            self.driver.set_window_size(1200, 1100)

    def points(self, chart):
        """The points of the first series of a chart (0 while it has none)."""
        # In one script: the page redraws the chart at every status.
        return self.driver.execute_script(
            "const p = document.querySelector(arguments[0]);"
            "return p ? Number(p.getAttribute('data-points')) : 0;", f"#{chart} path.series")

    def test_console(self):
        d = self.driver
        # Without credential: the API answers 401, to the browser as to a script.
        d.get(self.url + "api/tasks")
        self.assertIn("not logged in", d.find_element(By.TAG_NAME, "body").text)
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        with self.assertRaises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(self.url + "api/tasks/first", context=insecure, timeout=10)
        self.assertEqual(caught.exception.code, 401)

        # Log in; the task started with shoalctl is listed.
        d.get(self.url)
        self.wait(lambda d: d.find_element(By.ID, "token").is_displayed(), "the login form")
        self.shot("login")
        d.find_element(By.ID, "token").send_keys("wrong-token-0000000000")
        d.find_element(By.ID, "login-button").click()
        self.wait(lambda d: "wrong token" in d.find_element(By.ID, "login-error").text,
                  "the wrong token refused")
        d.find_element(By.ID, "token").clear()
        d.find_element(By.ID, "token").send_keys(ADMIN)
        d.find_element(By.ID, "login-button").click()
        self.wait(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-task="first"]'),
                  "task first in the list")

        # Its page: the task waits for peers; once they start, the accuracy curve grows as
        # rounds complete, without a reload.
        d.find_element(By.CSS_SELECTOR, 'tr[data-task="first"] a').click()
        self.wait(lambda d: d.find_elements(By.ID, "chart-accuracy"), "the task page")
        self.wait(lambda d: "waiting" in d.find_element(By.CSS_SELECTOR, "h1 .state").text,
                  "task first waiting for peers")
        self.assertEqual(self.points("chart-accuracy"), 0)
        d.execute_script("window.notReloaded = true;")
        # Every count of points the page draws, in order, recorded by the page itself at each
        # redraw: the rounds take about 0.1 s, faster than a WebDriver poll could see them.
        d.execute_script(
            "window.seenPoints = [];"
            "const note = () => {"
            "  const p = document.querySelector('#chart-accuracy path.series');"
            "  const n = p ? Number(p.getAttribute('data-points')) : 0;"
            "  const seen = window.seenPoints;"
            "  if (seen.length === 0 || seen[seen.length - 1] !== n) seen.push(n);"
            "};"
            "new MutationObserver(note).observe(document.body, {subtree: true, childList: true,"
            "  attributes: true, attributeFilter: ['data-points']});")
        for i in range(2):
            self.cluster.start_peer(i, 2, wait=False)
        self.cluster.wait_started()
        self.wait(lambda d: "completed" in d.find_element(By.CSS_SELECTOR, "h1 .state").text,
                  "task first completed", 60)
        self.wait(lambda d: self.points("chart-accuracy") == 3, "three evaluated rounds", 30)
        self.assertTrue(d.execute_script("return window.notReloaded === true;"))
        seen = d.execute_script("return window.seenPoints;")
        # The curve grew on the page: a partial curve was drawn before the whole one.
        self.assertTrue(any(1 <= n < 3 for n in seen), f"points drawn, in order: {seen}")
        self.shot("task", whole=True)

        # Its model downloads (with the page's cookie) as a model file.
        model = d.execute_script(
            "return fetch('/api/tasks/first/model').then(async (r) => ({status: r.status,"
            " disposition: r.headers.get('Content-Disposition'),"
            " magic: new TextDecoder().decode((await r.arrayBuffer()).slice(0, 8))}));")
        self.assertEqual(model["status"], 200)
        self.assertIn('filename="first-v3.shoal-model"', model["disposition"])
        self.assertEqual(model["magic"], "SHOALMDL")

        # The tasks list, now with the task's accuracy.
        d.get(self.url + "#/tasks")
        self.wait(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-task="first"] td.accuracy')
                  and "%" in d.find_element(By.CSS_SELECTOR,
                                            'tr[data-task="first"] td.accuracy').text,
                  "the accuracy column")

        # Peers and aggregators.
        d.get(self.url + "#/nodes")
        self.wait(lambda d: d.find_elements(By.ID, "peers") and
                  "peer-1" in d.find_element(By.ID, "peers").text, "the peers table")
        self.shot("nodes")

        # Create: a bad file shows the coordinator's message; a good one trains.
        d.get(self.url + "#/create")
        self.wait(lambda d: d.find_elements(By.ID, "task-file"), "the create page")
        d.find_element(By.ID, "task-file").send_keys("name: bad\ndataset:\n  partition: sideways\n")
        d.find_element(By.ID, "create").click()
        self.wait(lambda d: "dataset.partition" in d.find_element(By.ID, "create-error").text,
                  "the parser's message")
        self.shot("create")
        d.find_element(By.ID, "task-file").clear()
        d.find_element(By.ID, "task-file").send_keys(TASK.format(name="second", rounds=1))
        d.find_element(By.ID, "create").click()
        self.wait(lambda d: d.current_url.endswith("#/task/second"), "the new task's page")
        self.wait(lambda d: d.find_elements(By.CSS_SELECTOR, '#rounds tr[data-round="1"]'),
                  "a round of the task created from the page", 60)

        d.get(self.url + "#/tasks")
        self.wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-task]")) == 2,
                  "both tasks in the list")
        self.shot("tasks")

        # The session cookie is HttpOnly: the page's scripts cannot read it.
        self.assertEqual(d.execute_script("return document.cookie;"), "")
        with urllib.request.urlopen(urllib.request.Request(
                self.url + "api/tasks", headers={"Authorization": "Bearer " + VIEWER}),
                context=insecure, timeout=10) as response:
            names = [t["status"]["spec"]["name"] for t in json.load(response)["tasks"]]
        self.assertEqual(sorted(names), ["first", "second"])


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
