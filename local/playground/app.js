// The playground's behaviour: the heart, the burst, the controls, and the
// once-a-second sample of what the stack answers. Every request goes
// through the real routes of the local stack; `x-user-id` is its dev auth.
"use strict";

const $ = (id) => document.getElementById(id);
const reel = () => $("reel").value.trim();
const me = () => $("me").value.trim() || "me";
const enc = encodeURIComponent;

// One request: status (0 when there was no answer), the JSON body if any.
async function call(method, path, { user, key, body } = {}) {
  const headers = {};
  if (user) headers["x-user-id"] = user;
  if (key) headers["idempotency-key"] = key;
  if (body !== undefined) headers["content-type"] = "application/json";
  try {
    const r = await fetch(path, {
      method, headers, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch (_) { /* not JSON */ }
    return { status: r.status, ok: r.ok, json, text };
  } catch (e) {
    return { status: 0, ok: false, json: null, text: String(e) };
  }
}

function log(listId, line, bad) {
  const li = document.createElement("li");
  li.textContent = line;
  if (bad) li.className = "err";
  const list = $(listId);
  list.insertBefore(li, list.firstChild);
  while (list.children.length > 30) list.removeChild(list.lastChild);
}

function logAnswer(listId, what, a) {
  log(listId, `${what} → ${a.status || "no answer"} ${a.text}`, !a.ok);
}

// ---- The heart ------------------------------------------------------------

const likePath = () => `/reels/${enc(reel())}/like`;

async function showCount() {
  const a = await call("GET", `/reels/${enc(reel())}/likes`, { user: me() });
  if (a.ok && a.json) {
    $("count").textContent = a.json.count;
    $("liked").textContent = String(a.json.liked_by_me);
    $("age").textContent = a.json.age_ms;
    $("heart").setAttribute("aria-pressed", String(a.json.liked_by_me === true));
  } else {
    $("count").textContent = `? (${a.status || "no answer"})`;
    $("liked").textContent = "–";
    $("age").textContent = "–";
  }
  return a;
}

async function heart() {
  const liked = $("heart").getAttribute("aria-pressed") === "true";
  const method = liked ? "DELETE" : "PUT";
  const a = await call(method, likePath(), { user: me() });
  logAnswer("answers", `${method} ${likePath()}`, a);
  if (a.ok && a.json) $("heart").setAttribute("aria-pressed", String(a.json.liked));
  await showCount();
}

// Two likes at once, no key: the second is a no-op (`changed: false`).
async function doubleTap() {
  const both = await Promise.all([0, 1].map(() => call("PUT", likePath(), { user: me() })));
  both.forEach((a, i) => logAnswer("answers", `PUT (tap ${i + 1}) ${likePath()}`, a));
  await showCount();
}

// A client retrying one request with its Idempotency-Key: the retry gets the
// first answer again and counts nothing more.
async function retried() {
  const key = `tap-${Date.now().toString(36)}`;
  for (const attempt of ["first", "retry"]) {
    const a = await call("PUT", likePath(), { user: me(), key });
    logAnswer("answers", `PUT ${likePath()} Idempotency-Key: ${key} (${attempt})`, a);
  }
  await showCount();
}

// ---- Go viral ---------------------------------------------------------------

const tally = { offered: 0, accepted: 0, refused: 0 };
let burst = null;

function showTally() {
  for (const k of Object.keys(tally)) $(k).textContent = tally[k];
}

function go() {
  stop();
  const rate = Math.max(1, Math.min(2000, Number($("rate").value) || 1));
  const secs = Math.max(1, Math.min(600, Number($("duration").value) || 1));
  const run = Date.now().toString(36);
  const total = Math.round(rate * secs);
  const b = { n: 0, t0: performance.now() };
  // Ten ticks a second, each sending the likes due by then: rate × elapsed,
  // rate × duration in all.
  b.timer = setInterval(() => {
    const elapsed = (performance.now() - b.t0) / 1000;
    const due = Math.min(total, Math.floor(rate * elapsed));
    for (; b.n < due; b.n++) {
      const user = `viral-${run}-${b.n}`;
      tally.offered += 1;
      call("PUT", likePath(), { user }).then((a) => {
        if (a.ok) tally.accepted += 1; else tally.refused += 1;
        showTally();
      });
    }
    showTally();
    if (b.n >= total) stop();
  }, 100);
  burst = b;
  $("go").disabled = true;
  $("stop").disabled = false;
}

function stop() {
  if (burst) clearInterval(burst.timer);
  burst = null;
  $("go").disabled = false;
  $("stop").disabled = true;
}

// ---- Watch it -------------------------------------------------------------

const watched = { posted: 0, accepted: 0 };

// Many viewers, one batch each: every view of a viewer's batch counts once,
// and the viewer once among the unique viewers.
async function watch() {
  const viewers = Math.max(1, Math.min(500, Number($("viewers").value) || 1));
  const each = Math.max(1, Math.min(100, Number($("views-each").value) || 1));
  const run = Date.now().toString(36);
  const one = async (i) => {
    watched.posted += each;
    const a = await call("POST", "/views", {
      user: `watcher-${run}-${i}`,
      key: `watch-${run}-${i}`,
      body: { views: [{ reel_id: reel(), count: each }] },
    });
    if (a.ok && a.json) watched.accepted += a.json.accepted;
    $("views-posted").textContent = watched.posted;
    $("views-accepted").textContent = watched.accepted;
  };
  // A few at a time: a browser keeps about six requests in flight per host.
  for (let i = 0; i < viewers; i += 6) {
    await Promise.all(Array.from({ length: Math.min(6, viewers - i) }, (_, k) => one(i + k)));
  }
}

// The reel's views and its windowed counts, as the API answers them.
async function showViews() {
  const [views, stats] = await Promise.all([
    call("GET", `/reels/${enc(reel())}/views`),
    call("GET", `/reels/${enc(reel())}/stats`),
  ]);
  const v = views.ok && views.json ? views.json : null;
  $("views").textContent = v ? v.views : `? (${views.status || "no answer"})`;
  $("unique").textContent = v ? v.unique_viewers : "–";
  for (const w of ["1h", "24h", "7d"]) {
    const f = stats.ok && stats.json ? stats.json.windows[w] : null;
    $(`likes-${w}`).textContent = f ? f.likes : "–";
    $(`views-${w}`).textContent = f ? f.views : "–";
  }
  return v;
}

// ---- Trending now -----------------------------------------------------------

// The top 10 of the last hour by likes and by views, as the API ranks
// them (the cache warmer's list, or the instance's), each with its totals;
// the reel on the page in bold.
async function showTrending() {
  for (const metric of ["likes", "views"]) {
    const a = await call("GET", `/trending?metric=${metric}&window=1h&limit=10`);
    const list = $(`top-${metric}`);
    list.replaceChildren();
    $(`top-${metric}-note`).textContent = a.ok
      ? `ranked by the ${a.json.ranked_by}, ${Math.round(a.json.age_ms / 1000)} s ago`
      : (a.json?.error?.message ?? `${a.status}`);
    if (!a.ok || !a.json) continue;
    for (const r of a.json.reels) {
      const li = document.createElement("li");
      li.textContent = `${r.reel_id}: ${r.count} (all time: ${r.likes ?? "?"} likes, ${r.views ?? "?"} views)`;
      if (r.reel_id === reel()) li.className = "mine";
      list.appendChild(li);
    }
  }
}

// ---- Controls ---------------------------------------------------------------

let cacheTtl = null; // the TTL the stack started with, to restore

async function control(method, path, body, what) {
  const a = await call(method, path, { body });
  logAnswer("control-log", what, a);
  await sample();
}

const resize = () => {
  const shards = Number($("shards").value);
  return control("POST", `/admin/reels/${enc(reel())}/shards`, { shards },
    `POST /admin/reels/${reel()}/shards {"shards": ${shards}}`);
};
const lose = () => {
  const shard = Number($("shard").value);
  return control("PUT", "/__local/lost-shard", { reel: reel(), shard },
    `lose shard ${shard} of ${reel()}`);
};
const restoreShards = () => control("DELETE", "/__local/lost-shard", undefined, "every shard readable");
const dropCache = () => control("PUT", "/__local/cache", { ttl_ms: 0 }, "CACHE_TTL_MS=0");
const restoreCache = () => control("PUT", "/__local/cache", { ttl_ms: cacheTtl ?? 2000 },
  `CACHE_TTL_MS=${cacheTtl ?? 2000}`);

// ---- The sample, once a second --------------------------------------------

const charts = {};
const last = { offered: 0, accepted: 0, refused: 0, reads: null };
let sampling = false;

function setupCharts() {
  const c = $("charts");
  charts.likes = Chart.create(c, "chart-likes", "likes a second", [
    { key: "offered", label: "offered", color: "#6b6b70" },
    { key: "accepted", label: "accepted", color: "#2a7d46" },
    { key: "refused", label: "refused", color: "#b3261e" },
  ]);
  charts.shards = Chart.create(c, "chart-shards", "the reel's shards", [
    { key: "read", label: "read_shards", color: "#1f5fbf" },
    { key: "write", label: "write_shards", color: "#d62f5b" },
  ]);
  charts.count = Chart.create(c, "chart-count", "count served (gaps: no count)", [
    { key: "count", label: "count", color: "#1d1d1f" },
  ]);
  charts.age = Chart.create(c, "chart-age", "age_ms of the count served", [
    { key: "age", label: "age_ms", color: "#b36b00" },
  ]);
  charts.reads = Chart.create(c, "chart-reads", "shard items read a second (every read of the count)", [
    { key: "reads", label: "shard reads/s", color: "#6a3fb5" },
  ]);
  charts.views = Chart.create(c, "chart-views", "views and unique viewers", [
    { key: "views", label: "views", color: "#1f5fbf" },
    { key: "unique", label: "unique viewers", color: "#2a7d46" },
  ]);
}

async function sample() {
  if (sampling || !reel()) return;
  sampling = true;
  try {
    const [count, shards, state, views] = await Promise.all([
      showCount(),
      call("GET", `/admin/reels/${enc(reel())}/shards`),
      call("GET", `/__local/state?reel=${enc(reel())}`),
      showViews(),
      showTrending(),
    ]);
    const s = state.json || {};
    const d = {};
    for (const k of ["offered", "accepted", "refused"]) {
      d[k] = tally[k] - last[k];
      last[k] = tally[k];
    }
    const read = s.reel ? s.reel.shard_items_read : null;
    // (Negative after the reel was changed: not a rate.)
    const reads = read != null && last.reads != null && read >= last.reads
      ? read - last.reads : null;
    last.reads = read;
    const sh = shards.ok && shards.json ? shards.json : null;

    $("counting").textContent = s.counting ?? "?";
    $("read-shards").textContent = sh ? sh.read_shards : "?";
    $("write-shards").textContent = sh ? sh.write_shards : "?";
    $("phase").textContent = sh ? `(${sh.phase})` : "";
    $("served").textContent = count.ok
      ? `${count.json.count} (age_ms ${count.json.age_ms})`
      : `${count.status || "no answer"} ${count.json?.error?.code ?? ""}`;
    $("reads").textContent = reads ?? "–";
    if (cacheTtl == null && s.cache_ttl_ms > 0) cacheTtl = s.cache_ttl_ms;
    $("cache").textContent = s.cache_ttl_ms === 0 ? "off (CACHE_TTL_MS=0)" : `${s.cache_ttl_ms} ms`;
    const lost = (s.lost_shards || []).map((l) => `${l.reel} shard ${l.shard}`);
    $("lost").textContent = lost.length ? lost.join(", ") : "none";
    $("refused-reads").textContent = s.reads_refused ?? 0;
    verdict(count, lost.length > 0, s.cache_ttl_ms);

    charts.likes.push(Date.now(), d);
    charts.shards.push(Date.now(), { read: sh?.read_shards, write: sh?.write_shards });
    charts.count.push(Date.now(), { count: count.ok ? count.json.count : null });
    charts.age.push(Date.now(), { age: count.ok ? count.json.age_ms : null });
    charts.reads.push(Date.now(), { reads });
    charts.views.push(Date.now(), { views: views?.views, unique: views?.unique_viewers });
  } finally {
    sampling = false;
  }
}

// What the API's answer means, in one line.
function verdict(count, lost, ttl) {
  const v = $("verdict");
  v.className = "verdict";
  if (!count.ok) {
    v.className = "verdict bad";
    v.textContent = `GET /reels/${reel()}/likes answers ${count.status || "nothing"}`
      + ` ${count.json?.error?.code ?? ""}: ${lost ? "a shard is lost, and " : ""}`
      + `${ttl === 0 ? "with no cache every read sums every shard" : "no cached sum is left to serve"}.`;
  } else if (lost) {
    v.textContent = `A shard is lost, yet the count is served: a cached sum, age_ms ${count.json.age_ms}`
      + ` (accurate as of then; it stops once the cache expires).`;
  } else {
    v.textContent = "";
  }
}

// ---- Start ------------------------------------------------------------------

function start() {
  const fromUrl = new URLSearchParams(location.search).get("reel");
  $("reel").value = fromUrl || `play-${Date.now().toString(36)}`;
  $("heart").addEventListener("click", heart);
  $("double-tap").addEventListener("click", doubleTap);
  $("retry").addEventListener("click", retried);
  $("go").addEventListener("click", go);
  $("stop").addEventListener("click", stop);
  $("watch").addEventListener("click", watch);
  $("resize").addEventListener("click", resize);
  $("lose").addEventListener("click", lose);
  $("restore-shards").addEventListener("click", restoreShards);
  $("drop-cache").addEventListener("click", dropCache);
  $("restore-cache").addEventListener("click", restoreCache);
  setupCharts();
  window.playground = { charts, tally };
  sample();
  setInterval(sample, 1000);
}

start();
