#!/usr/bin/env python3
"""Assembles the Lambda figures (scripts/lambda-figures.sh) into JSON, and
renders that JSON as Markdown. Standard library only.

  report.py --work DIR --bin-dir DIR --criterion DIR --json OUT --md OUT \
      --build-seconds S --measure-seconds S --runs N --warmup N \
      --measure-ms MS --warmup-ms MS --commands FILE
      reads DIR/cold-<label>.json (bench/lambda/runtime_api.py),
      DIR/bench-meta-<output>.json and the criterion estimates under
      --criterion; writes the JSON (the record of the run) and the
      standalone Markdown of `make lambda-figures`.
  report.py --fragment JSON
      prints the figures of such a JSON as a Markdown section: the machine
      line and the two tables, no heading and no prose, for
      scripts/benchmarks.sh (the one writer of BENCHMARKS.md) to include.
  report.py --settings JSON
      prints the settings that run used, one `VARIABLE<TAB>value` a line.
"""

import argparse
import glob
import json
import os
import platform
import re
import subprocess

WORK = "."

# (label, binary, event, baseline label, what the first request is)
FUNCTIONS = [
    ("like", "like", "events/like.json", "PUT /reels/{id}/like (first like of a fresh user: settings read, like transaction, count read)"),
    ("read", "read", "events/read.json", "GET /reels/{id}/likes (settings, shard and like-row reads)"),
    ("read /healthz", "read", "events/healthz.json", "GET /healthz (readiness probe: a data-plane GetItem of a never-written key in each table)"),
    ("read /healthz, CA bundle only", "read", "events/healthz.json", "as above, with SSL_CERT_FILE=the system CA bundle and SSL_CERT_DIR empty: the SDK's rustls client reads the trust store as one file instead of this host's certificate directory"),
    ("reshard", "reshard", "events/reshard-schedule.json", "scheduled run (EventBridge event)"),
    ("reconcile", "reconcile", "events/reconcile-dry-run.json", "dry-run start ({\"mode\":\"start\",\"dry_run\":true})"),
    ("aggregate", "aggregate", "events/aggregate.json", "stream mode: one stream batch (checkpoint read, settings read, one chunk transaction)"),
    ("view", "view", "events/views.json", "POST /views (a fresh viewer's batch put on the views stream: one PutRecords)"),
    ("aggregate-views", "aggregate-views", "events/aggregate-views.json", "one views-stream batch (checkpoint and seen-id reads, shards listed, one chunk transaction; applied once)"),
]
BASELINES = [
    ("hello", "hello", "events/read.json", "lambda_runtime hello-world: event as serde_json::Value, JSON answer"),
    ("hello-http", "hello-http", "events/read.json", "lambda_http hello-world: API Gateway event, JSON response"),
]

BENCH_CASES = [
    ("hello/json", "lambda_runtime hello-world handler: event bytes -> Value -> JSON bytes"),
    ("hello-http/apigw", "lambda_http hello-world: event bytes -> Request -> Response -> API Gateway JSON"),
    ("read/get_likes_uncached", "read, GET /reels/{id}/likes, CACHE_TTL_MS=0 SETTINGS_TTL_MS=0 (every request calls canned DynamoDB)"),
    ("read/get_likes_cached", "read, GET /reels/{id}/likes, default TTLs: count and settings from the instance's caches; the caller's like row is still read"),
    ("like/put_like", "like, PUT /reels/{id}/like with Idempotency-Key, caches off"),
]


def safe(label):
    """A label as the script names its files."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label)


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def machine():
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load_start = None
    try:
        with open(os.path.join(WORK, "loadavg-measure-start.txt")) as f:
            load_start = f.read().split()[:3]
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return {
        "nproc": int(sh(["nproc"]) or 0),
        "cpu": cpu,
        "mem_total_kib": mem,
        "kernel": platform.release(),
        "arch": platform.machine(),
        "rustc": sh(["rustc", "-V"]),
        "cargo": sh(["cargo", "-V"]),
        "python": platform.python_version(),
        "git_head": sh(["git", "rev-parse", "--short", "HEAD"]),
        "git_dirty_files": len((sh(["git", "status", "--porcelain"]) or "").splitlines()),
        "loadavg_at_measure_start": load_start,
        "loadavg_at_report": open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else None,
    }


def ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return a / b


def load(path):
    with open(path) as f:
        return json.load(f)


def criterion_estimates(root, group):
    """{function id: {mean_ns, median_ns, ci}} of a criterion group."""
    out = {}
    for bj in glob.glob(os.path.join(root, "**", "new", "benchmark.json"), recursive=True):
        b = load(bj)
        if b.get("group_id") != group:
            continue
        est = load(os.path.join(os.path.dirname(bj), "estimates.json"))
        out[b["function_id"]] = {
            "mean_ns": est["mean"]["point_estimate"],
            "mean_ci95_ns": [est["mean"]["confidence_interval"]["lower_bound"], est["mean"]["confidence_interval"]["upper_bound"]],
            "median_ns": est["median"]["point_estimate"],
            "std_dev_ns": est["std_dev"]["point_estimate"],
        }
    return out


def fmt_ns(ns):
    if ns is None:
        return "n/a"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def fmt_x(r):
    return "n/a" if r is None else f"{r:.1f}×"


def fmt_ms(s):
    if not s:
        return "n/a"
    return f"{s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f})"


def assemble(args):
    """The record of one run, from its measurement files; written to --json."""
    global WORK
    WORK = args.work

    sizes = {}
    for name in ["hello", "hello-http", "like", "read", "reshard", "reconcile", "aggregate", "view", "aggregate-views"]:
        p = os.path.join(args.bin_dir, name)
        sizes[name] = os.path.getsize(p) if os.path.exists(p) else None

    cold = {}
    for label, _, _, _ in BASELINES + FUNCTIONS:
        p = os.path.join(args.work, "cold-" + safe(label) + ".json")
        cold[label] = load(p) if os.path.exists(p) else None

    bench = {}
    for output in ["deployed", "quiet"]:
        meta_path = os.path.join(args.work, f"bench-meta-{output}.json")
        bench[output] = {
            "estimates": criterion_estimates(args.criterion, f"handler-{output}"),
            "meta": load(meta_path) if os.path.exists(meta_path) else None,
        }

    hello_size = sizes["hello"]
    hello_cold = cold.get("hello") or {}

    def med(label, key):
        c = cold.get(label)
        return c[key]["median"] if c and c.get(key) else None

    rows = []
    for label, binary, event, what in BASELINES + FUNCTIONS:
        c = cold.get(label) or {}
        rows.append(
            {
                "function": label,
                "binary": binary,
                "event": event,
                "first_request": what,
                "size_bytes": sizes.get(binary),
                "size_mib": None if sizes.get(binary) is None else sizes[binary] / 2**20,
                "size_ratio": ratio(sizes.get(binary), hello_size),
                "init_ms": c.get("init_ms"),
                "init_ratio": ratio(med(label, "init_ms"), med("hello", "init_ms")),
                "first_response_ms": c.get("first_response_ms"),
                "first_response_ratio": ratio(med(label, "first_response_ms"), med("hello", "first_response_ms")),
                "invoke_ms": c.get("invoke_ms"),
                "peak_rss_kib": c.get("peak_rss_kib"),
                "cpu_ms": c.get("cpu_ms"),
                "cpu_ratio": ratio(med(label, "cpu_ms"), med("hello", "cpu_ms")),
                "peak_rss_ratio": ratio(med(label, "peak_rss_kib"), med("hello", "peak_rss_kib")),
                "first_response": c.get("first_response"),
                "failures": c.get("failures"),
            }
        )

    overhead = {}
    for output, b in bench.items():
        est = b["estimates"]
        base = (est.get("hello/json") or {}).get("mean_ns")
        overhead[output] = []
        for case, what in BENCH_CASES:
            e = est.get(case) or {}
            meta = (b["meta"] or {}).get(case) or {}
            overhead[output].append(
                {
                    "case": case,
                    "what": what,
                    "mean_ns": e.get("mean_ns"),
                    "median_ns": e.get("median_ns"),
                    "mean_ci95_ns": e.get("mean_ci95_ns"),
                    "ratio_to_hello": ratio(e.get("mean_ns"), base),
                    "dynamodb_calls_per_request": meta.get("dynamodb_calls"),
                }
            )

    with open(args.commands) as f:
        commands = [l.rstrip("\n") for l in f if l.strip()]

    doc = {
        "machine": machine(),
        "runs": args.runs,
        "warmup_runs": args.warmup,
        "durations_s": {"build": args.build_seconds, "measure": args.measure_seconds},
        "commands": commands,
        "dynamodb": args.dynamodb,
        "functions": rows,
        "handler_overhead": overhead,
        "settings": [
            ["RUNS", args.runs],
            ["WARMUP", args.warmup],
            ["BENCH_MEASURE_MS", args.measure_ms],
            ["BENCH_WARMUP_MS", args.warmup_ms],
        ],
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)
    return doc


def fragment(doc):
    """The figures of a run as Markdown: the machine line and the two tables.
    Data only: the headings above them and the notes below are the
    includer's (scripts/benchmarks.sh, or standalone() here)."""
    m = doc["machine"]
    rows = doc["functions"]
    overhead = doc["handler_overhead"]
    durations = doc["durations_s"]
    # What each first request is describes the code, not the run: the
    # current wording, also for a reused record (LAMBDA_FIGURES=reuse).
    described = {label: what for label, _, _, what in BASELINES + FUNCTIONS}
    md = []
    md.append(
        f"Machine: {m['nproc']} CPU(s), {m['cpu']}, {m['arch']}, {m['mem_total_kib'] // 1024 if m['mem_total_kib'] else '?'} MiB, "
        f"Linux {m['kernel']}; {m['rustc']}; source {m['git_head']} with {m['git_dirty_files']} uncommitted files; "
        f"load average at the start of the measurements {' '.join(m['loadavg_at_measure_start'] or ['n/a'])}. "
        f"Cold starts: {doc['runs']} measured runs per row after {doc['warmup_runs']} discarded one(s). "
        f"Script: build {durations['build']:.0f} s, measure {durations['measure']:.0f} s."
    )
    md.append("")
    md.append("### Bootstrap size, cold start, peak memory (ratio to the lambda_runtime hello-world)")
    md.append("")
    md.append("| function | first request | release bootstrap | × hello | init ms, median (min–max) | × hello | first response ms, median (min–max) | × hello | CPU ms to first response, median | × hello | peak RSS MiB, median (min–max) | × hello |")
    md.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        size = "n/a" if r["size_bytes"] is None else f"{r['size_bytes']:,} B ({r['size_mib']:.2f} MiB)"
        rss = r["peak_rss_kib"]
        rss_s = "n/a" if not rss else f"{rss['median'] / 1024:.1f} ({rss['min'] / 1024:.1f}–{rss['max'] / 1024:.1f})"
        fail = f" **{len(r['failures'])} failed runs**" if r["failures"] else ""
        what = described.get(r["function"], r["first_request"])
        md.append(
            f"| {r['function']} | {what}{fail} | {size} | {fmt_x(r['size_ratio'])} | {fmt_ms(r['init_ms'])} | {fmt_x(r['init_ratio'])} | "
            f"{fmt_ms(r['first_response_ms'])} | {fmt_x(r['first_response_ratio'])} | "
            f"{'n/a' if not r['cpu_ms'] else format(r['cpu_ms']['median'], '.1f')} | {fmt_x(r['cpu_ratio'])} | {rss_s} | {fmt_x(r['peak_rss_ratio'])} |"
        )
    md.append("")
    md.append("### Warm handler overhead per request, no network (criterion, mean; ratio to the lambda_runtime hello-world handler)")
    md.append("")
    md.append("| case | DynamoDB calls (canned) | deployed output: mean | × hello | quiet: mean | × hello |")
    md.append("|---|---|---|---|---|---|")
    dep = {o["case"]: o for o in overhead.get("deployed", [])}
    qui = {o["case"]: o for o in overhead.get("quiet", [])}
    for case, what in BENCH_CASES:
        d, q = dep.get(case, {}), qui.get(case, {})
        calls = d.get("dynamodb_calls_per_request")
        md.append(
            f"| `{case}`: {what} | {'n/a' if calls is None else calls} | {fmt_ns(d.get('mean_ns'))} | {fmt_x(d.get('ratio_to_hello'))} | "
            f"{fmt_ns(q.get('mean_ns'))} | {fmt_x(q.get('ratio_to_hello'))} |"
        )
    return "\n".join(md) + "\n"


def settings(doc):
    """[(variable, value)] of the lambda-figures.sh knobs the run used. A
    record written before it kept them has the cold-start counts, and the
    criterion times in its commands."""
    if doc.get("settings"):
        return [(k, str(v)) for k, v in doc["settings"]]
    out = [("RUNS", str(doc.get("runs"))), ("WARMUP", str(doc.get("warmup_runs")))]
    commands = " ".join(doc.get("commands") or [])
    for name in ["BENCH_MEASURE_MS", "BENCH_WARMUP_MS"]:
        found = re.search(r"\bLAMBDA_" + name + r"=(\S+)", commands)
        if found:
            out.append((name, found.group(1)))
    return out


def standalone(doc):
    """target/lambda-figures.md, the Markdown of `make lambda-figures` alone."""
    knobs = " ".join(f"{k}={v}" for k, v in settings(doc))
    return (
        "## Lambda figures\n\n"
        + fragment(doc)
        + "\nWhat these figures are, and are not: bench/lambda/README.md. "
        + "Every command of the run: `commands` in target/lambda-figures.json.\n\n"
        + f"Reproduce: `{knobs} make lambda-figures`.\n"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fragment", metavar="JSON", help="print the figures of JSON as a Markdown section")
    ap.add_argument("--settings", metavar="JSON", help="print the settings JSON's run used")
    ap.add_argument("--work")
    ap.add_argument("--bin-dir")
    ap.add_argument("--criterion")
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--build-seconds", type=float)
    ap.add_argument("--measure-seconds", type=float)
    ap.add_argument("--runs", type=int)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--measure-ms", type=int)
    ap.add_argument("--warmup-ms", type=int)
    ap.add_argument("--commands")
    ap.add_argument("--dynamodb", default="")
    args = ap.parse_args()
    if args.fragment:
        print(fragment(load(args.fragment)), end="")
        return
    if args.settings:
        for k, v in settings(load(args.settings)):
            print(f"{k}\t{v}")
        return
    missing = [f"--{a.replace('_', '-')}" for a in ["work", "bin_dir", "criterion", "json", "md", "commands"] if not getattr(args, a)]
    if missing:
        ap.error("assembling a run needs " + ", ".join(missing))
    doc = assemble(args)
    text = standalone(doc)
    with open(args.md, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
