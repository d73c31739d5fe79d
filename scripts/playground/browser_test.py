"""The playground in a real browser: headless Chromium, driven over WebDriver.

Usage: browser_test.py BASE_URL DYNAMODB_URL OUT_DIR

Against a running `likes-local serve`: load the page, tap the heart and see
the count and the stored row (DynamoDB's own GetItem) change, a double tap
and a retried Idempotency-Key change nothing more, a short burst below the
ceiling moves the chart and the counters with no refused like (screenshot:
OUT_DIR/burst.png), a watch by many viewers shows its views, unique viewers,
windowed counts and its place in the trending views (OUT_DIR/watch.png), a resize moves read_shards before
write_shards, then a
lost shard and a dropped cache show on the page as
the API's 503 (OUT_DIR/lost-shard.png).

Exit status: 0 passed, 1 failed, 3 Chromium or its driver could not start
(the caller decides whether that is a skip).
"""

import json
import os
import sys
import tempfile
import time
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = os.environ.get("CHROMIUM", "/usr/lib/chromium/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1500",
]


T0 = time.monotonic()


def step(msg):
    print(f"playground-test: {time.monotonic() - T0:5.1f} s  {msg}", flush=True)


def start_browser(profile):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(f)
    return webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))


def get_item(dynamo, user, reel):
    """The Likes table's row for (user, reel), read from DynamoDB directly."""
    body = json.dumps(
        {"TableName": "LikesTable", "ConsistentRead": True,
         "Key": {"user_id": {"S": user}, "reel_id": {"S": reel}}}
    ).encode()
    req = urllib.request.Request(dynamo + "/", data=body, method="POST", headers={
        "content-type": "application/x-amz-json-1.0",
        "x-amz-target": "DynamoDB_20120810.GetItem",
        "x-amz-date": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
        "authorization": "AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/dynamodb/"
                         "aws4_request, SignedHeaders=host, Signature=local",
    })
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r).get("Item")


def api(base, path, user=None):
    req = urllib.request.Request(base + path, headers={"x-user-id": user} if user else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def main():
    base, dynamo, out = sys.argv[1].rstrip("/"), sys.argv[2].rstrip("/"), sys.argv[3]
    os.makedirs(out, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="playground-chromium-")
    try:
        driver = start_browser(profile)
    except WebDriverException as e:
        print(f"playground-test: Chromium did not start: {e.msg or e}", file=sys.stderr)
        return 3
    started = time.monotonic()
    try:
        run(driver, base, dynamo, out)
    except (AssertionError, TimeoutException) as e:
        shot = os.path.join(out, "failure.png")
        driver.save_screenshot(shot)
        print(f"playground-test: FAILED: {e!r} (screenshot {shot})", file=sys.stderr)
        for entry in driver.get_log("browser"):
            print(f"  console: {entry}", file=sys.stderr)
        return 1
    finally:
        driver.quit()
    step(f"passed in {time.monotonic() - started:.1f} s")
    return 0


def run(d, base, dynamo, out):
    reel = f"browser-{int(time.time() * 1000):x}"
    text = lambda id: d.find_element(By.ID, id).text
    click = lambda id: d.find_element(By.ID, id).click()

    def wait(what, cond, timeout=15):
        step(f"waiting: {what}")
        WebDriverWait(d, timeout, poll_frequency=0.1).until(
            lambda _: cond(), message=what)

    def set_value(id, value):
        e = d.find_element(By.ID, id)
        e.clear()
        e.send_keys(str(value))

    d.get(f"{base}/?reel={reel}")
    assert d.title == "likes playground", d.title
    wait("the page shows the reel's count", lambda: text("count") == "0")
    # The stack's panel fills from its own request, which may answer after
    # the count's: waited for, not read once (a CI run read it empty).
    wait("the page shows the counting mode", lambda: text("counting") == "transactional")

    # The heart: the count and the stored row change.
    assert get_item(dynamo, "me", reel) is None
    click("heart")
    wait("the heart's like is counted", lambda: text("count") == "1" and text("liked") == "true")
    row = get_item(dynamo, "me", reel)
    assert row and row["reel_id"]["S"] == reel, row
    assert api(base, f"/reels/{reel}/likes", "me")["liked_by_me"] is True

    # A double tap and a retried Idempotency-Key change nothing more.
    click("double-tap")
    wait("both taps answered", lambda: text("answers").count('"changed":false') >= 2)
    click("retry")
    wait("the retry answered", lambda: "(retry)" in text("answers"))
    assert text("count") == "1", text("count")

    # Unlike: the row goes.
    click("heart")
    wait("the unlike is counted", lambda: text("count") == "0" and text("liked") == "false")
    assert get_item(dynamo, "me", reel) is None

    # A short burst well below the ceiling: every like accepted, the chart moves.
    set_value("rate", 20)
    set_value("duration", 4)
    click("go")
    wait("the burst offered its likes", lambda: int(text("offered")) == 80 and d.find_element(By.ID, "stop").get_attribute("disabled") is not None, timeout=20)
    wait("every like answered", lambda: int(text("accepted")) + int(text("refused")) == int(text("offered")))
    assert text("refused") == "0", f"refused {text('refused')} of {text('offered')}"
    points = lambda key: d.execute_script(
        "return window.playground.charts.likes.points(arguments[0]);", key)
    wait("the chart drew the burst", lambda: points("accepted") >= 4 and d.execute_script(
        "return document.querySelectorAll('#chart-likes polyline').length") >= 2)
    offered = int(text("offered"))
    wait("the count served caught up", lambda: text("count") == str(offered))
    d.save_screenshot(os.path.join(out, "burst.png"))
    step(f"burst: {offered} offered, {text('accepted')} accepted, screenshot {out}/burst.png")

    # Watch it: 30 viewers, 2 views each. The views and unique viewers
    # show, and the windows hold the burst's likes (the heart's like and
    # unlike net to nothing) and the views.
    set_value("viewers", 30)
    set_value("views-each", 2)
    click("watch")
    wait("every batch accepted", lambda: text("views-accepted") == "60", timeout=30)
    wait("the views are counted", lambda: text("views") == "60", timeout=60)
    unique = int(text("unique"))
    assert 28 <= unique <= 32, f"{unique} unique viewers estimated, 30 watched"
    wait("the windows hold the likes and the views", lambda: text("likes-1h") == str(offered)
         and text("likes-7d") == str(offered) and text("views-1h") == "60"
         and text("views-24h") == "60" and text("views-7d") == "60")
    wait("the views chart drew them", lambda: d.execute_script(
        "return window.playground.charts.views.points('views');") >= 2)
    # Trending now: the reel tops the likes and the views of the last hour
    # (ranked every 10 s; in the default transactional mode the like
    # function's own sketch names the candidates).
    wait("the reel tops the views list", lambda: text("top-views").startswith(f"{reel}: 60"),
         timeout=30)
    wait("the reel tops the likes list", lambda: text("top-likes").startswith(f"{reel}: {offered}"),
         timeout=30)
    d.save_screenshot(os.path.join(out, "watch.png"))
    step(f"watch: 60 views, {unique} unique viewers, screenshot {out}/watch.png")

    # Resize by hand: read_shards moves at once, write_shards after the
    # resize wait, when the local schedule (every second here) steps it.
    set_value("shards", 4)
    click("resize")
    wait("read_shards moved first", lambda: text("read-shards") == "4" and text("write-shards") == "1")
    wait("write_shards followed", lambda: text("write-shards") == "4", timeout=60)
    wait("the count served is unchanged", lambda: text("count") == str(offered))

    # Lose a shard, then drop the cache: the page shows the API's answer.
    set_value("shard", 0)
    click("lose")
    wait("the page reports the lost shard", lambda: f"{reel} shard 0" in text("lost"))
    click("drop-cache")
    wait("the cache is off", lambda: "off" in text("cache"))
    wait("the page shows the API's 503", lambda: "503" in text("verdict") and "503" in text("served"))
    # The state is sampled beside the count, so it may show the refusal a
    # second later.
    wait("the fault layer counted the refused reads", lambda: int(text("refused-reads")) > 0)
    d.save_screenshot(os.path.join(out, "lost-shard.png"))

    # And back: every shard readable, the cache on, the count served again.
    click("restore-shards")
    click("restore-cache")
    # (Two controls, each followed by a sample: wait for the state of both.)
    wait("the count is served again, with the cache back", lambda: text("cache") == "2000 ms"
         and text("lost") == "none" and text("verdict") == "" and text("count") == str(offered))


if __name__ == "__main__":
    sys.exit(main())
