// Small SVG charts for the Shoal console: line charts (per round) and bars. No library.
"use strict";

const ShoalCharts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 520, H = 240, M = { left: 52, right: 14, top: 12, bottom: 34 };

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, content, anchor) {
    const t = el("text", { x, y, "text-anchor": anchor || "middle" }, parent);
    t.textContent = content;
    return t;
  }

  // Up to `count` round numbers between lo and hi, for the axis ticks.
  function ticks(lo, hi, count, integer) {
    if (hi <= lo) return [lo];
    let step = (hi - lo) / count;
    const p = Math.pow(10, Math.floor(Math.log10(step)));
    step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= step) || step;
    if (integer) step = Math.max(1, Math.round(step));
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  function format(v) {
    if (Math.abs(v) >= 1000) return v.toFixed(0);
    if (Math.abs(v) >= 10) return v.toFixed(1);
    return v.toFixed(Math.abs(v) >= 1 ? 2 : 3);
  }

  function frame(svg, xs, ys, opts) {
    const sx = (x) => M.left + ((x - xs[0]) / (xs[1] - xs[0] || 1)) * (W - M.left - M.right);
    const sy = (y) => H - M.bottom - ((y - ys[0]) / (ys[1] - ys[0] || 1)) * (H - M.top - M.bottom);
    for (const v of ticks(ys[0], ys[1], 5, false)) {
      el("line", { class: "grid", x1: M.left, x2: W - M.right, y1: sy(v), y2: sy(v) }, svg);
      text(svg, M.left - 6, sy(v) + 4, format(v), "end");
    }
    for (const v of ticks(xs[0], xs[1], 8, true)) {
      text(svg, sx(v), H - M.bottom + 15, String(v));
    }
    el("line", { class: "axis", x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom },
       svg);
    el("line", { class: "axis", x1: M.left, x2: M.left, y1: M.top, y2: H - M.bottom }, svg);
    text(svg, (M.left + W - M.right) / 2, H - 4, opts.xLabel || "round");
    return { sx, sy };
  }

  function legend(series) {
    const div = document.createElement("div");
    div.className = "legend";
    for (const s of series) {
      const i = document.createElement("i");
      i.style.background = s.color;
      div.appendChild(i);
      div.appendChild(document.createTextNode(s.label));
    }
    return div;
  }

  function box(title, id) {
    const div = document.createElement("div");
    div.className = "chart";
    if (id) div.id = id;
    const h = document.createElement("h3");
    h.textContent = title;
    div.appendChild(h);
    return div;
  }

  // series: [{label, color, points: [[x, y], ...]}]; opts: {title, id, xLabel, yMin, yMax}.
  function line(series, opts) {
    const div = box(opts.title, opts.id);
    const all = series.flatMap((s) => s.points);
    if (all.length === 0) {
      const p = document.createElement("p");
      p.className = "muted";
      p.textContent = opts.empty || "no rounds yet";
      div.appendChild(p);
      return div;
    }
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" }, div);
    let xs = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
    if (xs[0] === xs[1]) xs = [xs[0] - 1, xs[1] + 1];
    let lo = opts.yMin !== undefined ? opts.yMin : Math.min(...all.map((p) => p[1]));
    let hi = opts.yMax !== undefined ? opts.yMax : Math.max(...all.map((p) => p[1]));
    if (lo === hi) { lo -= 0.5; hi += 0.5; }
    const { sx, sy } = frame(svg, xs, [lo, hi], opts);
    for (const s of series) {
      if (s.points.length === 0) continue;
      const d = s.points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`);
      el("path", { d: d.join(" "), fill: "none", stroke: s.color, "stroke-width": 2,
                   class: "series", "data-points": s.points.length }, svg);
      for (const p of s.points) {
        const c = el("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: s.color }, svg);
        el("title", {}, c).textContent = `round ${p[0]}: ${format(p[1])}`;
      }
    }
    div.appendChild(legend(series));
    return div;
  }

  // bars: [{x, y, color}] (one bar per round); opts as line().
  function bars(points, opts) {
    const div = box(opts.title, opts.id);
    if (points.length === 0) {
      const p = document.createElement("p");
      p.className = "muted";
      p.textContent = "no rounds yet";
      div.appendChild(p);
      return div;
    }
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" }, div);
    const xs = [Math.min(...points.map((p) => p.x)) - 0.5, Math.max(...points.map((p) => p.x)) + 0.5];
    const hi = Math.max(...points.map((p) => p.y)) || 1;
    const { sx, sy } = frame(svg, xs, [0, hi], opts);
    const width = Math.max(1, (sx(1) - sx(0)) * 0.7);
    for (const p of points) {
      const r = el("rect", { x: sx(p.x) - width / 2, y: sy(p.y), width,
                             height: Math.max(0, sy(0) - sy(p.y)), fill: p.color || "#5b8fd0" },
                   svg);
      el("title", {}, r).textContent = `round ${p.x}: ${format(p.y)}`;
    }
    return div;
  }

  // A tiny histogram of counts (a peer's labels), inline in a table cell.
  function histogram(counts) {
    const w = Math.max(40, counts.length * 8), h = 22;
    const svg = el("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img" });
    const hi = Math.max(...counts, 1);
    counts.forEach((c, i) => {
      const bh = (c / hi) * (h - 2);
      const r = el("rect", { x: i * (w / counts.length) + 1, y: h - bh,
                             width: Math.max(1, w / counts.length - 2), height: bh,
                             fill: "#5b8fd0" }, svg);
      el("title", {}, r).textContent = `class ${i}: ${c}`;
    });
    return svg;
  }

  return { line, bars, histogram };
})();
