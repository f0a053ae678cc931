// The mistk-rl dashboard: polls /api/view (harness/dashboard/view.py) and draws it as SVG.
// No libraries: it is packaged with mistk-rl and works offline. Every chart carries what
// it drew in data- attributes (series, points, last values), which the tests read.
"use strict";

const POLL_MS = 2000;
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"];
const SVG = "http://www.w3.org/2000/svg";
let polls = 0;

function el(tag, attrs = {}, parent = null, text = null) {
  const node = tag === "svg" || SVG_TAGS.has(tag) ? document.createElementNS(SVG, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}
const SVG_TAGS = new Set(["g", "path", "line", "rect", "text", "polyline", "title", "circle"]);

function fmt(v) {
  if (v === null || v === undefined) return "-";
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
  if (a >= 100) return v.toFixed(0);
  return v.toFixed(a >= 10 ? 1 : 2);
}

function ticks(lo, hi, n) {
  if (hi <= lo) return [lo];
  const step0 = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0);
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9; t += step) out.push(t);
  return out;
}

// series: [{name, points: [{x, mean, lo?, hi?}], dashed?}]; options: xLabel, yLabel, hline
function lineChart(series, options) {
  const W = 520, H = 280, L = 56, R = 12, T = 12, B = 40;
  const box = el("div", { class: "chart-box" });
  const svg = el("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "chart" }, box);
  const legend = el("div", { class: "legend" }, box);
  const all = series.flatMap((s) => s.points);
  svg.dataset.series = String(series.filter((s) => s.points.length).length);
  svg.dataset.points = String(all.length);
  if (!all.length) {
    el("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, svg, "no points yet");
    return box;
  }
  const xs = all.map((p) => p.x);
  const ys = all.flatMap((p) => [p.mean, p.lo ?? p.mean, p.hi ?? p.mean]);
  if (options.hline !== null && options.hline !== undefined) ys.push(options.hline);
  let [x0, x1] = [options.fromZero === false ? Math.min(...xs) : Math.min(0, ...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 1; y1 += 1; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  for (const t of ticks(y0, y1, 5)) {
    el("line", { x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid" }, svg);
    el("text", { x: L - 4, y: sy(t) + 4, "text-anchor": "end" }, svg, fmt(t));
  }
  for (const t of ticks(x0, x1, 5)) {
    el("text", { x: sx(t), y: H - B + 14, "text-anchor": "middle" }, svg, fmt(t));
  }
  el("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }, svg);
  el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }, svg);
  el("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, svg, options.xLabel);
  el("text", { x: 12, y: (T + H - B) / 2, transform: `rotate(-90 12 ${(T + H - B) / 2})`, "text-anchor": "middle" }, svg, options.yLabel);
  if (options.hline !== null && options.hline !== undefined) {
    el("line", { x1: L, x2: W - R, y1: sy(options.hline), y2: sy(options.hline), stroke: "#888", "stroke-dasharray": "2 3" }, svg);
  }
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const color = COLORS[i % COLORS.length];
    const g = el("g", { "data-name": s.name, "data-last": String(s.points[s.points.length - 1].mean), "data-n": String(s.points.length) }, svg);
    if (s.points.some((p) => p.lo !== undefined)) {
      const top = s.points.map((p) => `${sx(p.x)},${sy(p.hi ?? p.mean)}`);
      const bottom = s.points.slice().reverse().map((p) => `${sx(p.x)},${sy(p.lo ?? p.mean)}`);
      el("path", { d: `M${top.join("L")}L${bottom.join("L")}Z`, fill: color, opacity: 0.18, class: "band" }, g);
    }
    el("polyline", { points: s.points.map((p) => `${sx(p.x)},${sy(p.mean)}`).join(" "), fill: "none", stroke: color, "stroke-width": 1.8, "stroke-dasharray": s.dashed ? "5 3" : "", class: "line" }, g);
    if (s.points.length <= 60) {  // (a few points: each marked, and one alone is seen at all)
      for (const p of s.points) el("circle", { cx: sx(p.x), cy: sy(p.mean), r: 2.5, fill: color }, g);
    }
    const item = el("span", { class: "key" }, legend);
    el("span", { class: "swatch", style: `background:${color}${s.dashed ? ";opacity:.5" : ""}` }, item);
    item.appendChild(document.createTextNode(s.name));
  });
  return box;
}

function heatmap(league) {
  const ids = league.ids, n = ids.length, cell = Math.max(14, Math.min(36, Math.floor(420 / Math.max(1, n))));
  const L = 12 + 6.5 * Math.max(4, ...ids.map((id) => id.length)), T = 10;
  const W = L + n * cell + 10, H = T + n * cell + L;
  const svg = el("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "heatmap" });
  svg.dataset.players = String(n);
  let played = 0;
  for (let i = 0; i < n; i++) {
    el("text", { x: L - 4, y: T + i * cell + cell / 2 + 4, "text-anchor": "end" }, svg, ids[i]);
    for (let j = 0; j < n; j++) {
      const games = league.games[i][j], rate = league.winRate[i][j];
      const fill = games ? rateColor(rate) : "#d9d9d9";
      const r = el("rect", { x: L + j * cell, y: T + i * cell, width: cell - 1, height: cell - 1, fill, "data-rate": String(rate), "data-games": String(games), "data-row": ids[i], "data-col": ids[j] }, svg);
      el("title", {}, r, `${ids[i]} vs ${ids[j]}: ${games ? rate.toFixed(3) : "-"} over ${games} games`);
      if (games) played++;
    }
    const x = L + i * cell + cell / 2, y = T + n * cell + 6;
    el("text", { x, y, transform: `rotate(60 ${x} ${y})` }, svg, ids[i]);
  }
  svg.dataset.played = String(played);
  return svg;
}

function rateColor(rate) {  // red (0) - yellow (0.5) - green (1)
  const r = rate < 0.5 ? 215 : Math.round(215 - (rate - 0.5) * 2 * 180);
  const g = rate < 0.5 ? Math.round(48 + rate * 2 * 170) : 190;
  return `rgb(${r},${g},60)`;
}

function renderGroups(groups) {
  const root = document.getElementById("groups");
  root.replaceChildren();
  for (const group of groups) {
    const section = el("section", { class: "group", "data-name": group.name }, root);
    el("h2", {}, section, `${group.name}`);
    el("div", { class: "runs" }, section,
      `${group.seeds} run${group.seeds === 1 ? "" : "s"}: ` + group.runs.map((r) => `${r.dir} (seed ${r.seed ?? "-"}, ${r.state})`).join("; ") +
      (group.seeds > 1 ? " | bands: lowest to highest run" : " | bands: evaluations ± 1 std over their episodes; training 10th-90th percentile per bin"));
    const row = el("div", { class: "row" }, section);
    const train = [{ name: group.seeds > 1 ? `training episodes (mean of ${group.seeds} runs)` : "training episodes", points: group.train }];
    group.live.forEach((points, i) => train.push({ name: `live: last 100 episodes${group.live.length > 1 ? " #" + (i + 1) : ""}`, points: points.map(([x, y]) => ({ x, mean: y })), dashed: true }));
    if (group.unit === "env steps") {
      const f1 = el("figure", { class: "returns" }, row);
      el("figcaption", {}, f1, "Return of training episodes");
      f1.appendChild(lineChart(train, { xLabel: group.unit, yLabel: "return", hline: group.stopValue }));
    }
    const f2 = el("figure", { class: "evals" }, row);
    el("figcaption", {}, f2, group.unit === "env steps" ? "Evaluations: mean return (greedy, fixed seeds)" : "Evaluations: win rate per opponent and seat");
    const evals = Object.entries(group.evals).map(([name, points]) => ({ name, points }));
    f2.appendChild(lineChart(evals, { xLabel: group.unit, yLabel: group.unit === "env steps" ? "mean return" : "win rate", hline: group.stopValue }));
  }
}

function renderLeague(view) {
  const section = document.getElementById("league");
  if (!view.league) { section.hidden = true; return; }
  section.hidden = false;
  document.getElementById("payoff").replaceChildren(heatmap(view.league));
  const kinds = Object.fromEntries(view.league.players.map((p) => [p.id, p.kind]));
  const ratings = Object.entries(view.ratings).map(([name, points]) => ({
    name, points: points.map(([x, y]) => ({ x, mean: y })), dashed: (kinds[name] ?? "").startsWith("Historical"),
  }));
  document.getElementById("ratings").replaceChildren(lineChart(ratings, { xLabel: "main player's steps", yLabel: "exposure", fromZero: false }));
}

function renderServices(services) {
  const body = document.querySelector("#services tbody");
  body.replaceChildren();
  if (!services.length) {
    el("td", { colspan: 10, class: "none" }, el("tr", {}, body), "none running (the runs have finished, or wrote no services.json)");
  }
  for (const s of services) {
    const tr = el("tr", { "data-key": s.key, "data-state": s.state ?? "", "data-up": String(s.up) }, body);
    const returns = s.returnMean ? Object.values(s.returnMean) : [];
    const cells = [s.run, s.name, s.role, s.up ? s.state ?? "?" : `down (${s.error ?? "no answer"})`,
      fmt(s.envStepsPerS), fmt(s.requestsPerS), fmt(s.episodesPerS),
      returns.length ? returns.map(fmt).join(" / ") : "-", fmt(s.rssMiB), s.url];
    cells.forEach((c, i) => el("td", i === 3 && !s.up ? { class: "down" } : {}, tr, c));
  }
}

async function poll() {
  try {
    const answer = await fetch("api/view", { cache: "no-store" });
    if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
    const view = await answer.json();
    renderGroups(view.groups);
    renderLeague(view);
    renderServices(view.services);
    polls++;
    const updated = document.getElementById("updated");
    updated.dataset.polls = String(polls);
    updated.textContent = `updated ${new Date(view.updated * 1000).toLocaleTimeString()} (every ${POLL_MS / 1000} s)`;
  } catch (err) {
    document.getElementById("updated").textContent = `no answer from the dashboard: ${err.message}`;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
