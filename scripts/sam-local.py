"""Every sample event of events/ through `sam local invoke`, checked: what
each function answered and what it changed in the tables. Run by
scripts/sam-local.sh (which builds the bootstraps, starts Docker, the
local DynamoDB and a Kinesis emulator), with the Python of target/sam-venv
(SAM's own, for its YAML reader and boto3):

    python scripts/sam-local.py --endpoint URL --kinesis-endpoint URL \
        --image NAME --bin DIR --out DIR --home DIR

1. A SAM build directory like the one `sam build` makes (.aws-sam/build):
   OUT/build/<Function>/bootstrap, a link to the host build of the
   function's package (CodeUri functions/<package>), and OUT/build/template.yaml,
   template.yaml with each CodeUri pointing there, and AWS_ENDPOINT_URL_KINESIS
   declared on the functions that reach the views stream (SAM passes a
   function only the variables its template declares; the deployed template
   needs none: the SDK finds Kinesis itself).
2. Each event goes to the function whose trigger it is, read from the
   template: an HTTP event to the function with its routeKey, a stream
   batch to the DynamoDB stream consumer, a Kinesis batch to the views
   stream's consumer, EventBridge's scheduled event to
   the function scheduled without an input, a {"mode": ...} to the one
   whose schedule passes such an input. Every file in events/ has a step
   below and every function gets at least one event, or this fails.
3. Each step is one `sam local invoke` (through scripts/sam-host-network.py:
   containers on the host network), judged by the JSON SAM printed (never
   by its exit status: SAM exits 0 after a container that never answered),
   then by the tables and the views stream, read directly with boto3.
   The views stream (VIEWS_STREAM, the name the local stack gives the
   template's ViewsStream) is made here, with one shard, on the Kinesis
   emulator: POST /views puts its record there, and the views
   aggregator's ListShards (its shard's parents) reads it.

Prints one line per invoke with its time, and `sam-local: N passed, M
failed`; exits non-zero if any step failed.
"""

import argparse
import base64
import datetime
import json
import os
import platform
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import boto3
from samcli.yamlhelper import yaml_dump, yaml_parse

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
COUNTERS = "CountersTable"
LIKES = "LikesTable"
VIEWS = "ViewsTable"
# The views stream: the template's ViewsStream has no Name, so the local
# stack names it by its logical id (local/src/kinesis/def.rs), as here.
STREAM = "ViewsStream"
STREAM_ARN = f"arn:aws:kinesis:{REGION}:000000000000:stream/{STREAM}"
INVOKE_TIMEOUT_SECS = 180


class Failed(Exception):
    pass


def check(ok, what):
    if not ok:
        raise Failed(what)


def eq(have, want, what):
    check(have == want, f"{what}: {have!r}, expected {want!r}")


# ---- The tables --------------------------------------------------------------


class Tables:
    """The local DynamoDB, read directly (never through a function)."""

    def __init__(self, endpoint):
        self.ddb = boto3.client(
            "dynamodb",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )

    def scan(self, table):
        items, start = [], {}
        while True:
            page = self.ddb.scan(TableName=table, ConsistentRead=True, **start)
            items += page["Items"]
            if "LastEvaluatedKey" not in page:
                return items
            start = {"ExclusiveStartKey": page["LastEvaluatedKey"]}

    def item(self, table, key):
        key = {k: {"S": v} for k, v in key.items()}
        return self.ddb.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")

    def counter(self, pk):
        return self.item(COUNTERS, {"pk": pk})

    def like_row(self, user, reel):
        return self.item(LIKES, {"user_id": user, "reel_id": reel})

    def with_prefix(self, prefix):
        return [i for i in self.scan(COUNTERS) if i["pk"]["S"].startswith(prefix)]

    def shard_items(self, reel):
        shard = re.compile(r"^\d{3}#reel#" + re.escape(reel) + "#likes$")
        return [i for i in self.scan(COUNTERS) if shard.match(i["pk"]["S"])]

    def writer_items(self, reel):
        """Stream mode's writer items of the reel (and their base)."""
        return [i for i in self.scan(VIEWS) if i["pk"]["S"] == f"l#{reel}"]

    def count(self, reel):
        """The reel's stored count: its shards' n, its base item's, and
        stream mode's writer items'."""
        base = self.counter(f"base#reel#{reel}#likes")
        items = self.shard_items(reel) + ([base] if base else []) + self.writer_items(reel)
        return sum(int(i.get("n", {"N": "0"})["N"]) for i in items)

    def like_rows(self):
        return len(self.scan(LIKES))

    def view_items(self, reel, prefix):
        """The reel's view items whose sort key starts with `prefix` (all#:
        one per writer for all time; d#: one per writer and UTC day)."""
        return [
            i
            for i in self.scan(VIEWS)
            if i["pk"]["S"] == f"v#{reel}" and i["sk"]["S"].startswith(prefix)
        ]

    def views(self, reel):
        """The reel's stored all-time views: its writers' all# items' v."""
        return sum(int(i.get("v", {"N": "0"})["N"]) for i in self.view_items(reel, "all#"))


class Stream:
    """The views stream on the Kinesis emulator, read directly."""

    def __init__(self, endpoint):
        self.kinesis = boto3.client(
            "kinesis",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )

    def create(self, within=60):
        """Makes the stream (one shard) once the emulator answers, and
        waits until it is ACTIVE."""
        t0 = time.monotonic()
        while True:
            try:
                self.kinesis.list_streams()
                break
            except Exception as e:  # not answering yet (it starts in about 3 s)
                if time.monotonic() - t0 > within:
                    raise Failed(f"the Kinesis emulator did not answer within {within} s: {e}")
                time.sleep(0.2)
        try:
            self.kinesis.create_stream(
                StreamName=STREAM, ShardCount=1, StreamModeDetails={"StreamMode": "PROVISIONED"}
            )
        except self.kinesis.exceptions.ResourceInUseException:
            pass
        while True:
            d = self.kinesis.describe_stream_summary(StreamName=STREAM)["StreamDescriptionSummary"]
            if d["StreamStatus"] == "ACTIVE":
                eq(d["StreamARN"], STREAM_ARN, "the stream's ARN (events/aggregate-views.json names it)")
                return
            if time.monotonic() - t0 > within:
                raise Failed(f"{STREAM} not ACTIVE within {within} s: {d}")
            time.sleep(0.1)

    def records(self):
        """Every record of every shard, from the start (decoded JSON)."""
        out = []
        for shard in self.kinesis.list_shards(StreamName=STREAM)["Shards"]:
            it = self.kinesis.get_shard_iterator(
                StreamName=STREAM, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]
            while it:
                page = self.kinesis.get_records(ShardIterator=it, Limit=1000)
                out += [json.loads(r["Data"]) for r in page["Records"]]
                if not page["Records"] or page.get("MillisBehindLatest", 0) == 0:
                    break
                it = page.get("NextShardIterator")
        return out


# ---- What each event must do, in order -----------------------------------------


def http(out):
    """An HTTP function's answer (payload format 2.0): status, JSON body, headers."""
    check(isinstance(out, dict) and "statusCode" in out, f"not an HTTP answer: {out}")
    headers = {k.lower(): v for k, v in (out.get("headers") or {}).items()}
    eq(headers.get("content-type"), "application/json", "content-type")
    return out["statusCode"], json.loads(out.get("body") or "null"), headers


def error_answer(status, code, rows=0):
    def step(out, db):
        s, body, _ = http(out)
        eq((s, (body.get("error") or {}).get("code")), (status, code), "status, error.code")
        eq(db.like_rows(), rows, "like rows")

    return step


def healthz(out, db):
    s, body, _ = http(out)
    eq((s, body), (200, {"status": "ok"}), "answer")


def not_found(out, db):
    s, body, _ = http(out)
    eq((s, body["error"]["code"]), (404, "not_found"), "answer")


def method_not_allowed(out, db):
    s, body, headers = http(out)
    eq((s, body["error"]["code"]), (405, "method_not_allowed"), "answer")
    check({"PUT", "DELETE"} <= {m.strip() for m in headers.get("allow", "").split(",")}, f"Allow: {headers}")
    eq(db.like_rows(), 0, "like rows")


def like(out, db):
    s, body, _ = http(out)
    eq((s, body), (200, {"reel_id": "reel-8841", "liked": True, "changed": True, "count": 1}), "answer")
    check(db.like_row("user-42", "reel-8841") is not None, "no like row (user-42, reel-8841)")
    eq(db.like_rows(), 1, "like rows")
    eq(db.count("reel-8841"), 1, "reel-8841's shards")
    # The event's Idempotency-Key: its record, in the same transaction.
    eq(len(db.with_prefix("idem#")), 1, "key records")


def like_again(out, db):
    # The same event delivered again, to a new container (a cold start):
    # the key record answers it; nothing is counted twice.
    s, body, _ = http(out)
    eq((s, body["changed"], body["count"]), (200, True, 1), "status, changed, count")
    eq(db.like_rows(), 1, "like rows")
    eq(db.count("reel-8841"), 1, "reel-8841's shards")


def read(out, db):
    s, body, _ = http(out)
    eq((s, body["reel_id"], body["count"], body["liked_by_me"]), (200, "reel-8841", 1, True), "answer")


def batch_read(out, db):
    s, body, _ = http(out)
    eq((s, body["counts"]), (200, {"reel-8841": 1, "reel-17": 0, "reel-99": 0}), "answer")


def unlike(out, db):
    s, body, _ = http(out)
    eq((s, body), (200, {"reel_id": "reel-8841", "liked": False, "changed": True, "count": 0}), "answer")
    eq(db.like_row("user-42", "reel-8841"), None, "like row after the unlike")
    eq(db.count("reel-8841"), 0, "reel-8841's shards")


def settings(db, reel):
    item = db.counter(f"reel#{reel}#settings")
    check(item is not None, f"no settings item for {reel}")
    return {k: next(iter(v.values())) for k, v in item.items()}


# When the resize was started (the schedule's check depends on it).
RESIZE = {}


def resize_started(out, db):
    RESIZE["started"] = time.monotonic()
    s, body, _ = http(out)
    eq((s, body["outcome"], body["phase"], body["target"]), (202, "started", "growing", 8), "answer")
    st = settings(db, "reel-8841")
    eq((st["read_shards"], st["write_shards"], st["rz"]), ("8", "1", "resized"), "stored settings")


def resize_state(out, db):
    s, body, _ = http(out)
    eq((s, body["read_shards"], body["write_shards"], body["phase"]), (200, 8, 1, "growing"), "answer")


def scheduled_reshard(out, db):
    # The resizing reel's next step is due only after the production wait
    # (settings TTL, request timeout and margins: about 19 s): the run
    # leaves it waiting, without sleeping, and says so. On a machine so
    # slow that the wait has passed since the resize started, it may take
    # the step instead: then only a clean run over that one reel is asked.
    check(isinstance(out.get("duration_ms"), int), f"duration_ms in {out}")
    eq((out.get("reels"), out.get("errors")), (1, 0), f"summary {out}")
    if time.monotonic() - RESIZE.get("started", 0) < 15:
        eq(out.get("waiting"), 1, f"waiting in {out}")
        eq(settings(db, "reel-8841")["write_shards"], "1", "write_shards")


def seed_drift(db):
    # A reel whose shard says 3 and which has no like row: drift for
    # reconciliation to find (unstamped, so never deferred as busy).
    db.ddb.put_item(TableName=COUNTERS, Item={"pk": {"S": "000#reel#drifted#likes"}, "n": {"N": "3"}})


def reconcile_dry_run(out, db):
    eq((out.get("dry_run"), out.get("complete")), (True, True), f"summary {out}")
    eq((out.get("reels_corrected"), out.get("total_abs_drift")), (1, 3), f"drift reported {out}")
    eq(db.count("drifted"), 3, "the dry run changed a shard")


def reconcile(out, db):
    eq((out.get("invocation"), out.get("complete"), out.get("dry_run")), ("started", True, False), f"summary {out}")
    eq((out.get("reels_corrected"), out.get("corrected_reels")), (1, ["drifted"]), f"corrections {out}")
    eq(db.count("drifted"), 0, "drifted's count after the run")
    check(db.counter("reel#drifted#reconcile") is not None, "no ledger item for the correction")
    eq(db.count("reel-8841"), 0, "reel-8841's shards")


AGG_SEQ = "111100000000004242424202".rjust(40, "0")


def aggregate(out, db):
    # fan-1's like (a stream-mode row) and fan-2's unlike of r1: +1 and -1,
    # applied in one chunk that moves the stream shard's checkpoint.
    eq(out, {"state": {}, "batchItemFailures": []}, "answer")
    cps = db.with_prefix("agg#")
    eq(len(cps), 1, "checkpoints")
    eq((cps[0]["seq"]["S"], cps[0]["records"]["N"]), (AGG_SEQ, "2"), "checkpoint (seq, records)")
    check(db.writer_items("r1"), "no writer item of r1 written")
    eq(db.count("r1"), 0, "r1's count (+1 -1)")


def aggregate_again(out, db):
    # Delivered again: every record is at or below the checkpoint.
    eq(out, {"state": {}, "batchItemFailures": []}, "answer")
    cps = db.with_prefix("agg#")
    eq((len(cps), cps[0]["records"]["N"]), (1, "2"), "checkpoints, records applied")
    eq(db.count("r1"), 0, "r1's shards")


def view(out, db):
    # user-42's 2 views of r1: answered once the record is in the stream.
    s, body, _ = http(out)
    eq((s, body), (202, {"accepted": 2}), "answer")
    recs = db.stream.records()
    eq(len(recs), 1, f"records in {STREAM}")
    r = recs[0]
    eq((r["f"], r["viewer"], r["views"]), (1, "user-42", [["r1", 2]]), "the record (format, viewer, views)")
    check(re.fullmatch(r"[0-9a-f]{16}", r["id"]), f"event id {r['id']!r}")
    check(abs(r["at"] / 1000 - time.time()) < 600, f"at {r['at']}: not now")
    # Not applied here: only the views aggregator writes view items (the
    # likes' writer items, l#…, and their trending sketches, top#likes#…,
    # share the table, as do the known reels, x~…: the registrations the
    # like function and the likes' aggregator put for reel-8841 and r1).
    likes_items = ("l#", "top#likes#", "x~")
    eq(
        [i for i in db.scan(VIEWS) if not i["pk"]["S"].startswith(likes_items)],
        [],
        "view items before the aggregator ran",
    )


def utc_day(ms):
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).date()


def batch_views():
    """What events/aggregate-views.json carries, per reel: views, viewers,
    and the views and viewers within the _7d window (today, UTC, and the
    six days before) as of now (its records are of a fixed day)."""
    event = json.loads((ROOT / "events" / "aggregate-views.json").read_text())
    today = datetime.datetime.now(datetime.timezone.utc).date()
    out = {}
    for rec in event["Records"]:
        body = json.loads(base64.b64decode(rec["kinesis"]["data"]))
        recent = 0 <= (today - utc_day(body["at"])).days < 7
        for reel, n in body["views"]:
            o = out.setdefault(reel, {"views": 0, "viewers": set(), "views_7d": 0, "viewers_7d": set()})
            o["views"] += n
            o["viewers"].add(body["viewer"])
            if recent:
                o["views_7d"] += n
                o["viewers_7d"].add(body["viewer"])
    return out


def aggregate_views(out, db):
    # Three records of one shard (fan-1 twice, fan-2 once): each reel's
    # all-time item of that shard holds their views; checkpoint and seen
    # item in the same transactions.
    eq(out, {"batchItemFailures": []}, "answer")
    want = batch_views()
    check(set(want) == {"r1", "r2"}, f"reels of the event: {sorted(want)}")
    for reel, w in want.items():
        eq(len(db.view_items(reel, "all#")), 1, f"{reel}'s all-time items (one shard)")
        eq(db.views(reel), w["views"], f"{reel}'s stored views")
        eq(sum(int(i["v"]["N"]) for i in db.view_items(reel, "d#")), w["views"], f"{reel}'s day items' views")
    eq(len([i for i in db.scan(VIEWS) if i["pk"]["S"].startswith("ck#")]), 1, "checkpoints")


def aggregate_views_again(out, db):
    # Delivered again, to a new container (its seen ids not in memory):
    # every record is at or below the checkpoint; nothing doubles.
    eq(out, {"batchItemFailures": []}, "answer")
    for reel, w in batch_views().items():
        eq(db.views(reel), w["views"], f"{reel}'s stored views after the redelivery")
        eq(sum(int(i["v"]["N"]) for i in db.view_items(reel, "d#")), w["views"], f"{reel}'s day items' views")


def view_figures(body, w, what):
    have = {k: body[k] for k in ("views", "unique_viewers", "views_7d", "unique_viewers_7d")}
    want = {
        "views": w["views"],
        "unique_viewers": len(w["viewers"]),
        "views_7d": w["views_7d"],
        "unique_viewers_7d": len(w["viewers_7d"]),
    }
    eq(have, want, what)


def reel_views(out, db):
    s, body, _ = http(out)
    eq((s, body["reel_id"]), (200, "r1"), "status, reel_id")
    view_figures(body, batch_views()["r1"], "r1's views")
    check(isinstance(body["age_ms"], int), f"age_ms {body.get('age_ms')!r}")


def reel_stats(out, db):
    # The sample's views by window, as of now (its records are of a fixed
    # day: the windows keep them as long as their buckets last); r1's likes
    # net to nothing (like.json and unlike.json, aggregate.json's +1, -1).
    s, body, _ = http(out)
    eq((s, body["reel_id"]), (200, "r1"), "status, reel_id")
    now = int(time.time() * 1000)
    event = json.loads((ROOT / "events" / "aggregate-views.json").read_text())
    starts = {
        "1h": (now - 3_600_000) // 300_000 * 300_000,
        "24h": (now - 86_400_000) // 3_600_000 * 3_600_000,
        "7d": (now - 7 * 86_400_000) // 86_400_000 * 86_400_000,
    }
    for name, start in starts.items():
        want = 0
        for rec in event["Records"]:
            body_ = json.loads(base64.b64decode(rec["kinesis"]["data"]))
            at = body_["at"] if name != "7d" else body_["at"] // 86_400_000 * 86_400_000
            if at >= start:
                want += sum(n for reel, n in body_["views"] if reel == "r1")
        f = body["windows"][name]
        eq((f["views"], f["likes"]), (want, 0), f"r1's {name} views and likes")
    check(isinstance(body["as_of"], int), f"as_of {body.get('as_of')!r}")


def counts(out, db):
    s, body, _ = http(out)
    eq((s, sorted(body["counts"])), (200, ["r1", "r2"]), "status, reels")
    want = batch_views()
    for reel in ("r1", "r2"):
        c = body["counts"][reel]
        # r1's likes: +1 and -1 (aggregate.json); r2: none.
        eq(c["likes"], 0, f"{reel}'s likes")
        view_figures(c, want[reel], f"{reel}'s views")
    check(isinstance(body["age_ms"], int), f"age_ms {body.get('age_ms')!r}")


def warm(out, db):
    # One round of the cache warmer: the likes and views lists (both
    # modes) ranked and written, and the warm set, though the sample's
    # views are of a fixed past day (nothing trends now).
    eq((out.get("rounds"), out.get("errors"), out.get("lists")), (1, 0, 4), f"summary {out}")
    for pk in ("trending#likes#1h", "trending#likes#24h", "trending#views#1h",
               "trending#views#24h", "trending#warm"):
        check(db.counter(pk) is not None, f"no {pk} item")
    # The known reels' fold ran first (docs/known-reels.md): its meta item,
    # with the heartbeat of this run.
    meta = db.item(VIEWS, {"pk": "x~set", "sk": "~meta"})
    check(meta is not None and "seen" in meta, f"known reels' meta item {meta}")


# (event file, check, prepare): run in this order, on one pair of tables.
STEPS = [
    ("healthz.json", healthz, None),
    ("not-found.json", not_found, None),
    ("like-no-identity.json", error_answer(401, "unauthorized"), None),
    ("like-bad-reel.json", error_answer(400, "invalid_reel_id"), None),
    ("method-not-allowed.json", method_not_allowed, None),
    ("like.json", like, None),
    ("like.json", like_again, None),
    ("read.json", read, None),
    ("batch-read.json", batch_read, None),
    ("unlike.json", unlike, None),
    ("admin-shards-post.json", resize_started, None),
    ("admin-shards-get.json", resize_state, None),
    ("reshard-schedule.json", scheduled_reshard, None),
    ("reconcile-dry-run.json", reconcile_dry_run, seed_drift),
    ("reconcile.json", reconcile, None),
    ("aggregate.json", aggregate, None),
    ("aggregate.json", aggregate_again, None),
    ("views.json", view, None),
    ("aggregate-views.json", aggregate_views, None),
    ("aggregate-views.json", aggregate_views_again, None),
    ("reel-views.json", reel_views, None),
    ("reel-stats.json", reel_stats, None),
    ("counts.json", counts, None),
    ("warm.json", warm, None),
]

# ---- The template: functions, their triggers, the build directory -----------


def functions(template):
    return {
        lid: r for lid, r in template["Resources"].items() if r.get("Type") == "AWS::Serverless::Function"
    }


def function_for(event, fns):
    """The function whose trigger in the template sends `event`."""

    def triggers(kind):
        for lid, r in fns.items():
            for ev in (r["Properties"].get("Events") or {}).values():
                if ev["Type"] == kind:
                    yield lid, ev.get("Properties") or {}

    if "Records" in event:
        kinesis = (event["Records"] or [{}])[0].get("eventSource") == "aws:kinesis"
        return [lid for lid, _ in triggers("Kinesis" if kinesis else "DynamoDB")]
    if "requestContext" in event:
        key = event["routeKey"]
        return [
            lid
            for lid, p in triggers("HttpApi")
            if (p["Path"] == "$default" and key == "$default") or key == f"{p['Method']} {p['Path']}"
        ]
    if event.get("detail-type") == "Scheduled Event":
        # The rule the event names (`…:rule/<stack>-<Function>Schedule`).
        rules = " ".join(event.get("resources") or [])
        return sorted({lid for lid, p in triggers("Schedule") if "Input" not in p and f"-{lid}Schedule" in rules})
    if "rounds" in event:
        # The warm function's own event: some rounds, then the answer.
        return sorted({lid for lid, _ in triggers("Schedule") if fns[lid]["Properties"]["CodeUri"].rstrip("/").endswith("warm")})
    if "mode" in event:
        return sorted({lid for lid, p in triggers("Schedule") if "mode" in json.loads(p.get("Input") or "{}")})
    return []


def build_dir(template, bin_dir, out):
    """OUT/build as `sam build` lays out .aws-sam/build: one directory per
    function with its bootstrap, and the template pointing at them."""
    build = out / "build"
    for lid, r in functions(template).items():
        package = Path(r["Properties"]["CodeUri"]).name
        binary = bin_dir / package
        check(binary.is_file(), f"{binary}: not built (CodeUri {r['Properties']['CodeUri']})")
        (build / lid).mkdir(parents=True, exist_ok=True)
        bootstrap = build / lid / "bootstrap"
        bootstrap.unlink(missing_ok=True)
        try:
            os.link(binary, bootstrap)  # 70 MB debug builds: no copy
        except OSError:
            bootstrap.write_bytes(binary.read_bytes())
            bootstrap.chmod(0o755)
        r["Properties"]["CodeUri"] = lid
        variables = ((r["Properties"].get("Environment") or {}).get("Variables")) or {}
        if "VIEWS_STREAM" in variables:
            # Declared, so that the env-vars file can set it (the deployed
            # function reaches Kinesis itself).
            variables["AWS_ENDPOINT_URL_KINESIS"] = ""
    (build / "template.yaml").write_text(yaml_dump(template))
    return build / "template.yaml"


# ---- Invoking ----------------------------------------------------------------------


def sam_env(home):
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "LC_ALL": "C.UTF-8",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        "SAM_CLI_TELEMETRY": "0",
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
        # Anything SAM would still fetch over HTTP(S) fails at once
        # (the discard port); SAM's own calls to the container stay direct.
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "https_proxy": "http://127.0.0.1:9",
        "http_proxy": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    if os.environ.get("DOCKER_HOST"):
        env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    return env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True, help="the local DynamoDB (http://127.0.0.1:PORT)")
    ap.add_argument("--kinesis-endpoint", required=True, help="the Kinesis emulator (http://127.0.0.1:PORT)")
    ap.add_argument("--image", required=True, help="the invoke base image (--invoke-image)")
    ap.add_argument("--bin", required=True, type=Path, help="where the functions' host builds are")
    ap.add_argument("--out", required=True, type=Path, help="build directory and logs")
    ap.add_argument("--home", required=True, type=Path, help="SAM's HOME (its config dir)")
    args = ap.parse_args()
    for url in (args.endpoint, args.kinesis_endpoint):
        check(re.match(r"^http://127\.0\.0\.1:\d+$", url), f"endpoint {url}: loopback only")

    text = (ROOT / "template.yaml").read_text()
    fns = functions(yaml_parse(text))
    built = build_dir(yaml_parse(text), args.bin, args.out)  # a copy of its own

    files = sorted(p.name for p in (ROOT / "events").glob("*.json"))
    stepped = {e for e, _, _ in STEPS}
    check(not set(files) - stepped, f"events without a step here: {sorted(set(files) - stepped)}")
    check(not stepped - set(files), f"steps without an event file: {sorted(stepped - set(files))}")
    target = {}
    for name in files:
        found = function_for(json.loads((ROOT / "events" / name).read_text()), fns)
        check(len(found) == 1, f"{name}: sent by {found or 'no function'} in template.yaml")
        target[name] = found[0]
    check(not set(fns) - set(target.values()), f"functions without an event: {set(fns) - set(target.values())}")

    # The environment the template gives the functions, as overrides (SAM
    # leaves the table refs, the Secrets Manager key and the conditional
    # endpoint unresolved). Inside Lambda the functions refuse to run
    # without a deployment's SHARD_KEY of at least 32 bytes.
    common = {
        "AWS_ENDPOINT_URL_DYNAMODB": args.endpoint,
        "COUNTERS_TABLE": COUNTERS,
        "LIKES_TABLE": LIKES,
        # Stream mode's writer items: in the views table, as the template
        # wires WRITERS_TABLE.
        "WRITERS_TABLE": VIEWS,
        "SHARD_KEY": secrets.token_hex(32),
        "COUNTING": "transactional",
        # The user events carry an access token with the template's default
        # scope; the admin events are signed by a session of this role
        # (arn:aws:sts::123456789012:assumed-role/likes-operators/ops-admin),
        # allowlisted as a deployment would (AdminPrincipals; empty refuses
        # every principal). Only the reshard function declares it.
        "JWT_SCOPE": "likes/api",
        "ADMIN_PRINCIPALS": "arn:aws:iam::123456789012:role/likes-operators",
        # Where a function declares them (views: read, view, aggregate-views).
        "VIEWS_TABLE": VIEWS,
        "VIEWS_STREAM": STREAM,
        "AWS_ENDPOINT_URL_KINESIS": args.kinesis_endpoint,
    }
    env_vars = {"Parameters": common}
    for lid, r in fns.items():
        if any(e["Type"] == "DynamoDB" for e in (r["Properties"].get("Events") or {}).values()):
            env_vars[lid] = {**common, "COUNTING": "stream"}  # the stream consumer
    env_file = args.out / "env-vars.json"
    env_file.write_text(json.dumps(env_vars, indent=2))

    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}[platform.machine().lower()]
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    db = Tables(args.endpoint)
    check(VIEWS in db.ddb.list_tables()["TableNames"], f"no {VIEWS} on the local DynamoDB")
    db.stream = Stream(args.kinesis_endpoint)
    t0 = time.monotonic()
    try:
        db.stream.create()
    except Failed as e:
        sys.exit(f"sam-local: FAILED: the views stream: {e}")
    print(f"sam-local: Kinesis stream {STREAM} ready ({time.monotonic() - t0:.1f} s)", flush=True)
    env = sam_env(args.home)
    passed = failed = 0
    started = time.monotonic()
    for i, (name, step, prepare) in enumerate(STEPS, 1):
        fn = target[name]
        if prepare:
            prepare(db)
        cmd = [
            sys.executable,
            str(ROOT / "scripts" / "sam-host-network.py"),
            "local",
            "invoke",
            fn,
            "--template",
            str(built),
            "--event",
            str(ROOT / "events" / name),
            "--env-vars",
            str(env_file),
            "--parameter-overrides",
            f"Architecture={arch}",
            "JwtIssuer=https://issuer.example.com",
            "JwtAudience=local",
            "--docker-network",
            "host",
            "--skip-pull-image",
            "--invoke-image",
            args.image,
            "--region",
            REGION,
        ]
        log = logs / f"{i:02d}-{fn}-{name.removesuffix('.json')}.log"
        t0 = time.monotonic()
        try:
            p = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=INVOKE_TIMEOUT_SECS, stdin=subprocess.DEVNULL
            )
            stdout, stderr = p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            stdout, stderr = e.stdout or "", (e.stderr or "") + f"\n(killed after {INVOKE_TIMEOUT_SECS} s)"
            if isinstance(stdout, bytes):
                stdout, stderr = stdout.decode(), stderr.decode() if isinstance(stderr, bytes) else stderr
        took = time.monotonic() - t0
        log.write_text(f"$ {' '.join(cmd)}\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
        try:
            try:
                out = json.loads(stdout)
            except ValueError:
                raise Failed("SAM printed no JSON answer (the function did not answer)")
            check(not (isinstance(out, dict) and "errorType" in out), f"the function failed: {out}")
            step(out, db)
        except (Failed, KeyError, TypeError, ValueError) as e:
            failed += 1
            print(f"FAIL {fn:21} {name:24} {took:5.1f} s  {type(e).__name__}: {e}", flush=True)
            print(f"     printed: {stdout.strip()[:600]}", flush=True)
            tail = "\n".join("     | " + line for line in stderr.strip().splitlines()[-25:])
            print(f"     SAM's last lines (all in {log.relative_to(ROOT) if log.is_relative_to(ROOT) else log}):\n{tail}")
            continue
        passed += 1
        body = out.get("body", out) if isinstance(out, dict) else out
        print(f"ok   {fn:21} {name:24} {took:5.1f} s  {str(body)[:90]}", flush=True)
    print(f"{len(STEPS)} invokes in {time.monotonic() - started:.0f} s")
    print(f"sam-local: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
