"use strict";
// Live: per engine tokens/s, TTFT p50/p95, queue, running, KV cache use, prefix hit rate; charts of the
// last five minutes, one point a second from the `live` stream.
(() => {
  const {el, events, fmt, section, api, notice} = VS;
  const app = document.getElementById("app");
  const KEEP = 300;
  const cards = new Map();  // engine id -> {data, plots, figures}
  const gw = el("div", {class: "figures", id: "gateway-figures"});
  const gpu = el("span", {class: "muted"});
  const grid = el("div", {class: "grid", id: "engines"});
  const empty = el("p", {class: "muted", text: "No engine is running (ready or asleep) right now."});
  app.replaceChildren(section("Gateway", gw, gpu), grid, empty);

  // Each tile carries its field's name (data-figure): what it shows is the stream's figure, "–" when none came.
  const figure = (label, value, key) => el("div", {class: "figure", "data-figure": key || null},
    el("b", {text: value}), el("span", {text: label}));
  const clock = (s) => new Date(s * 1000).toLocaleTimeString([], {hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false});

  // Time ticks in whole seconds (uPlot's time axis shows milliseconds on a span of a few seconds), and a y
  // axis from 0 with its unit, shown before the first point arrives.
  function chart(target, title, labels, colors, unit) {
    const width = Math.max(260, target.clientWidth - 10);
    const opts = {title, width, height: 170, legend: {show: true},
      scales: {x: {time: false}, y: {range: (u, min, max) => [0, max > 0 ? max * 1.15 : 1]}},
      series: [{label: "time", value: (u, v) => v === null ? "–" : clock(v)},
        ...labels.map((l, i) => ({label: l, stroke: colors[i], width: 1.5, spanGaps: true}))],
      axes: [{incrs: [1, 2, 5, 10, 15, 30, 60, 120, 300], values: (u, ticks) => ticks.map(clock), space: 70},
        {size: 56, label: unit, labelSize: 16, values: (u, ticks) => ticks.map((v) => +v.toFixed(2))}]};
    const plot = new uPlot(opts, [[], ...labels.map(() => [])], target);
    target.plot = plot;  // its axes' tick labels, read by the browser tests
    return plot;
  }

  function card(row) {
    const figures = el("div", {class: "figures"});
    const c1 = el("div", {"data-chart": "tokens"}), c2 = el("div", {"data-chart": "ttft"}), c3 = el("div", {"data-chart": "queue"});
    const box = el("section", {class: "card engine", "data-engine": row.id},
      el("h2", {}, `${row.model} `, el("span", {class: "muted", text: row.id})), figures, c1, c2, c3);
    grid.append(box);
    const data = {t: [], tok: [], p50: [], p95: [], wait: [], run: [], kv: []};
    return {box, figures, data, boxes: [c1, c2, c3], plots: [
      chart(c1, "tokens/s generated", ["tokens/s"], ["#2f5bd3"], "tokens/s"),
      chart(c2, "TTFT ms (last minute)", ["p50", "p95"], ["#1a7f37", "#c62828"], "ms"),
      chart(c3, "requests and KV cache", ["waiting", "running", "KV %"], ["#9a6700", "#2f5bd3", "#7b1fa2"], "requests, %"),
    ]};
  }

  function push(arr, v) { arr.push(v ?? null); if (arr.length > KEEP) arr.shift(); }
  // How many points a chart draws (data-points): what the browser tests check, as a user sees lines or none.
  const points = (...series) => series.reduce((n, s) => n + s.filter((v) => v !== null).length, 0);

  function update(sample) {
    const g = sample.gateway;
    gw.replaceChildren(figure("requests/s", fmt(g.requests_s, 2), "requests_s"), figure("in flight", fmt(g.in_flight, 0), "in_flight"),
      figure("TTFT p50 (gateway)", fmt(g.ttft_p50_ms, 0, " ms"), "ttft_p50_ms"), figure("TTFT p95 (gateway)", fmt(g.ttft_p95_ms, 0, " ms"), "ttft_p95_ms"));
    gpu.textContent = sample.gpu_used_gib === null ? "GPU memory: no GPU probe on this machine" : `GPU memory used: ${sample.gpu_used_gib} GiB`;
    const now = Date.now() / 1000;
    const seen = new Set();
    for (const row of sample.engines) {
      seen.add(row.id);
      if (!cards.has(row.id)) cards.set(row.id, card(row));
      const c = cards.get(row.id);
      c.figures.replaceChildren(
        figure("tokens/s", fmt(row.tokens_s), "tokens_s"), figure("TTFT p50", fmt(row.ttft_p50_ms, 0, " ms"), "ttft_p50_ms"),
        figure("TTFT p95", fmt(row.ttft_p95_ms, 0, " ms"), "ttft_p95_ms"), figure("waiting", fmt(row.waiting, 0), "waiting"),
        figure("running", fmt(row.running, 0), "running"), figure("KV cache use", fmt(row.kv_use_pct, 1, " %"), "kv_use_pct"),
        figure("prefix cache hits", fmt(row.prefix_hit_pct, 1, " %"), "prefix_hit_pct"), figure("state", row.state, "state"));
      const d = c.data;
      push(d.t, now); push(d.tok, row.tokens_s); push(d.p50, row.ttft_p50_ms); push(d.p95, row.ttft_p95_ms);
      push(d.wait, row.waiting); push(d.run, row.running); push(d.kv, row.kv_use_pct);
      c.plots[0].setData([d.t, d.tok]);
      c.plots[1].setData([d.t, d.p50, d.p95]);
      c.plots[2].setData([d.t, d.wait, d.run, d.kv]);
      c.boxes[0].dataset.points = points(d.tok);
      c.boxes[1].dataset.points = points(d.p50, d.p95);
      c.boxes[2].dataset.points = points(d.wait, d.run, d.kv);
    }
    for (const [id, c] of cards) {
      if (!seen.has(id)) { c.box.remove(); cards.delete(id); }
    }
    empty.hidden = cards.size > 0;
  }

  api("/ui/api/live").then(update).catch((e) => notice(e.message, "error"));
  events(["live"], {live: update});
})();
