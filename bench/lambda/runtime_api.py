#!/usr/bin/env python3
"""A fake AWS Lambda Runtime API and a cold-start driver, standard library only.

It serves the three calls a Rust runtime makes:

  GET  /2018-06-01/runtime/invocation/next            one event, with the
       Lambda-Runtime-Aws-Request-Id, -Deadline-Ms, -Invoked-Function-Arn
       and -Trace-Id headers; a second poll is held until the run ends
  POST /2018-06-01/runtime/invocation/{id}/response    the answer
  POST /2018-06-01/runtime/invocation/{id}/error       a handler error
  POST /2018-06-01/runtime/init/error                  an init error

and, for each of --runs runs, spawns the bootstrap with
AWS_LAMBDA_RUNTIME_API pointing at it.

Run -1 (and below, with --warmup N) is a warm-up run, reported apart and
left out of the figures. For each run it records, from just before the spawn
(monotonic clock):

  init_ms            until its first /next poll (process start, config, SDK
                     client built: what Lambda reports as Init Duration)
  first_response_ms  until the first response POST has been received (init
                     plus the first invocation, its DynamoDB calls included)
  invoke_ms          first_response_ms - init_ms
  peak_rss_kib       VmHWM from /proc/<pid>/status, read when the process
                     polls /next again after answering (the first
                     invocation is complete) and before it is killed
  cpu_ms             CPU time of the process's threads by then (the sum of
                     /proc/<pid>/task/*/schedstat): less sensitive than the
                     wall-clock figures to other work on the machine

Usage (see scripts/lambda-figures.sh):

  runtime_api.py --bin target/.../read --event events/read.json --runs 10 \
      --label read --out read.json [--vary headers.idempotency-key ...] \
      [--env NAME=VALUE ...] [--expect-status 200] [--log-dir DIR]

The process gets only PATH, LANG, TZ, AWS_LAMBDA_RUNTIME_API and the --env
variables.

--vary PATH appends "-<label>-<run>-<nonce>" to the string at that
dot-separated path of the event for each run (e.g. the JWT sub and the
Idempotency-Key of a like, so that every run is a first like, not a replay).
--expect-status N fails the run unless the response JSON's statusCode is N
(API Gateway events); without it any response counts.
"""

import argparse
import copy
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFIX = "/2018-06-01/runtime"


class Run:
    """What one spawned process did."""

    def __init__(self, event_bytes):
        self.event = event_bytes
        self.request_id = str(uuid.uuid4())
        self.lock = threading.Lock()
        self.t_next = None
        self.t_response = None
        self.t_next2 = None
        self.response = None
        self.error = None
        self.served = False
        self.progress = threading.Event()  # second poll, error or response
        self.done = threading.Event()  # the run is over: release held polls


class State:
    run = None


def read_body(handler):
    """The request body, Content-Length or chunked."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = b""
        while True:
            line = handler.rfile.readline()
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                # Trailers, up to the empty line.
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return out
            out += handler.rfile.read(size)
            handler.rfile.readline()
    n = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(n) if n else b""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def reply(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self):
        now = time.perf_counter_ns()
        run = State.run
        if self.path != PREFIX + "/invocation/next" or run is None:
            self.reply(404, b'{"errorType":"NotFound"}')
            return
        with run.lock:
            first = not run.served
            run.served = True
            if first:
                run.t_next = now
            elif run.t_next2 is None:
                run.t_next2 = now
        if first:
            deadline = int(time.time() * 1000) + 900_000
            self.reply(
                200,
                run.event,
                [
                    ("Content-Type", "application/json"),
                    ("Lambda-Runtime-Aws-Request-Id", run.request_id),
                    ("Lambda-Runtime-Deadline-Ms", str(deadline)),
                    (
                        "Lambda-Runtime-Invoked-Function-Arn",
                        "arn:aws:lambda:us-east-1:123456789012:function:bench",
                    ),
                    ("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000;Sampled=0"),
                ],
            )
            return
        # The first invocation is complete: hold this poll until the driver
        # has read the process's memory and killed it.
        run.progress.set()
        run.done.wait(120)
        self.close_connection = True

    def do_POST(self):
        body = read_body(self)
        now = time.perf_counter_ns()
        run = State.run
        if run is None:
            self.reply(404)
            return
        if self.path == PREFIX + "/init/error":
            with run.lock:
                run.error = ("init", body.decode("utf-8", "replace"))
            run.progress.set()
        elif self.path == f"{PREFIX}/invocation/{run.request_id}/response":
            with run.lock:
                run.t_response = now
                run.response = body
        elif self.path == f"{PREFIX}/invocation/{run.request_id}/error":
            with run.lock:
                run.error = ("invocation", body.decode("utf-8", "replace"))
            run.progress.set()
        else:
            self.reply(404)
            return
        self.reply(202, b'{"status":"OK"}', [("Content-Type", "application/json")])


def set_path(doc, path, suffix):
    keys = path.split(".")
    node = doc
    for k in keys[:-1]:
        node = node[k]
    if not isinstance(node.get(keys[-1]), str):
        raise SystemExit(f"--vary {path}: not a string in the event")
    node[keys[-1]] = node[keys[-1]] + suffix


def vm_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_ms(pid):
    """CPU time of all the process's live threads so far, from schedstat (ns)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e6


def summary(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--event", required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="runs before the measured ones, reported apart and left out of the figures "
        "(the first exec of a just-built binary pays for its page cache)",
    )
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vary", action="append", default=[])
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--expect-status", type=int)
    ap.add_argument("--log-dir")
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()

    with open(args.event, "rb") as f:
        event_doc = json.load(f)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()

    # A clean environment, as on Lambda: nothing of the caller's leaks in
    # (AWS profiles, endpoints, RUST_LOG) unless passed with --env.
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "TZ": ":UTC"}
    for kv in args.env:
        k, _, v = kv.partition("=")
        base_env[k] = v
    base_env["AWS_LAMBDA_RUNTIME_API"] = f"127.0.0.1:{port}"

    nonce = f"{int(time.time())}{os.getpid()}"
    runs = []
    warmups = []
    failures = []
    for i in range(-args.warmup, args.runs):
        doc = copy.deepcopy(event_doc)
        for path in args.vary:
            set_path(doc, path, f"-{args.label}-{i}-{nonce}")
        run = Run(json.dumps(doc).encode())
        State.run = run
        log = subprocess.DEVNULL
        if args.log_dir:
            os.makedirs(args.log_dir, exist_ok=True)
            safe = re.sub(r"[^A-Za-z0-9._-]+", "-", args.label)
            name = f"{safe}-{i}.log" if i >= 0 else f"{safe}-warmup{-i}.log"
            log = open(os.path.join(args.log_dir, name), "wb")
        t0 = time.perf_counter_ns()
        proc = subprocess.Popen([args.bin], env=base_env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        got = False
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            if run.progress.wait(0.05):
                got = True
                break
            if proc.poll() is not None:
                break
        cpu = cpu_ms(proc.pid)
        hwm = vm_kib(proc.pid, "VmHWM")
        rss = vm_kib(proc.pid, "VmRSS")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        run.done.set()
        if log is not subprocess.DEVNULL:
            log.close()
        problem = None
        if run.error:
            problem = f"{run.error[0]} error: {run.error[1][:500]}"
        elif not got or run.t_response is None:
            problem = f"no response within {args.timeout}s (exit status {proc.returncode})"
        response = None
        if run.response is not None:
            try:
                response = json.loads(run.response)
            except ValueError:
                response = run.response.decode("utf-8", "replace")
        if problem is None and args.expect_status is not None:
            status = response.get("statusCode") if isinstance(response, dict) else None
            if status != args.expect_status:
                problem = f"statusCode {status}, expected {args.expect_status}: {str(response)[:500]}"
        ms = lambda t: None if t is None else (t - t0) / 1e6
        rec = {
            "run": i,
            "init_ms": ms(run.t_next),
            "first_response_ms": ms(run.t_response),
            "invoke_ms": None
            if run.t_response is None or run.t_next is None
            else (run.t_response - run.t_next) / 1e6,
            "peak_rss_kib": hwm,
            "rss_at_end_kib": rss,
            "cpu_ms": cpu,
            "problem": problem,
        }
        if i == 0:
            rec["response"] = response
        (warmups if i < 0 else runs).append(rec)
        if problem:
            failures.append(f"run {i}: {problem}")
        print(
            f"  {args.label} run {i}: init {rec['init_ms'] or float('nan'):.2f} ms, "
            f"first response {rec['first_response_ms'] or float('nan'):.2f} ms, "
            f"CPU {cpu or float('nan'):.2f} ms, peak RSS {hwm} KiB" + (f"  FAILED: {problem}" if problem else ""),
            file=sys.stderr,
        )
    server.shutdown()

    out = {
        "label": args.label,
        "bin": args.bin,
        "event": args.event,
        "runs": runs,
        "warmup_runs": warmups,
        "failures": failures,
        "init_ms": summary([r["init_ms"] for r in runs if not r["problem"]]),
        "first_response_ms": summary([r["first_response_ms"] for r in runs if not r["problem"]]),
        "invoke_ms": summary([r["invoke_ms"] for r in runs if not r["problem"]]),
        "peak_rss_kib": summary([r["peak_rss_kib"] for r in runs if not r["problem"]]),
        "cpu_ms": summary([r["cpu_ms"] for r in runs if not r["problem"]]),
        "first_response": runs[0].get("response") if runs else None,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    if failures:
        print(f"{args.label}: {len(failures)} of {args.warmup + args.runs} runs failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
