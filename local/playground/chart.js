// A small line chart in SVG, drawn by hand: one chart per quantity, the
// last WINDOW seconds, one polyline per series. No library (offline).
"use strict";

const Chart = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const WINDOW = 60; // seconds shown
  const W = 600, H = 170, PAD_L = 44, PAD_R = 8, PAD_T = 8, PAD_B = 18;

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }

  // A round number at or above max, so the axis reads well.
  function niceMax(max) {
    if (!(max > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(max)));
    for (const m of [1, 2, 5, 10]) if (m * p >= max) return m * p;
    return 10 * p;
  }

  // series: [{key, label, color, step?}]; points are added with push().
  function create(container, id, title, series) {
    const box = document.createElement("div");
    box.className = "chart";
    box.id = id;
    const h = document.createElement("h3");
    h.textContent = title;
    box.appendChild(h);
    const legend = document.createElement("div");
    legend.className = "legend";
    for (const s of series) {
      const span = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = s.color;
      span.appendChild(swatch);
      span.appendChild(document.createTextNode(s.label));
      legend.appendChild(span);
    }
    box.appendChild(legend);
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" });
    box.appendChild(svg);
    container.appendChild(box);
    const data = []; // [{t, values: {key: number|null}}]
    return {
      push(t, values) {
        data.push({ t, values });
        while (data.length > WINDOW) data.shift();
        draw(svg, data, series);
      },
      // How many points were drawn for a series (the browser test reads it).
      points(key) {
        return data.filter((d) => d.values[key] != null).length;
      },
    };
  }

  function draw(svg, data, series) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    let max = 0;
    for (const d of data) for (const s of series) {
      const v = d.values[s.key];
      if (v != null && v > max) max = v;
    }
    max = niceMax(max);
    const x = (i) => PAD_L + (i / (WINDOW - 1)) * (W - PAD_L - PAD_R);
    const y = (v) => H - PAD_B - (v / max) * (H - PAD_T - PAD_B);
    // Axes and three gridlines, labelled.
    for (const f of [0, 0.5, 1]) {
      const v = max * f;
      el("line", { x1: PAD_L, x2: W - PAD_R, y1: y(v), y2: y(v), stroke: "#e4e4e8" }, svg);
      const label = el("text", { x: PAD_L - 4, y: y(v) + 3, "text-anchor": "end" }, svg);
      label.textContent = Number.isInteger(v) ? String(v) : v.toFixed(1);
    }
    const now = el("text", { x: W - PAD_R, y: H - 4, "text-anchor": "end" }, svg);
    now.textContent = "now";
    const ago = el("text", { x: PAD_L, y: H - 4 }, svg);
    ago.textContent = `-${WINDOW} s`;
    const offset = WINDOW - data.length;
    for (const s of series) {
      // A gap (null: no answer) breaks the line.
      let run = [];
      const flush = () => {
        if (run.length > 0) {
          el("polyline", {
            points: run.join(" "), fill: "none", stroke: s.color,
            "stroke-width": 2, "data-series": s.key,
          }, svg);
        }
        run = [];
      };
      data.forEach((d, i) => {
        const v = d.values[s.key];
        if (v == null) return flush();
        run.push(`${x(offset + i).toFixed(1)},${y(v).toFixed(1)}`);
        if (run.length === 1) {
          el("circle", { cx: x(offset + i), cy: y(v), r: 1.5, fill: s.color }, svg);
        }
      });
      flush();
    }
  }

  return { create };
})();
