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

  const figure = (label, value) => el("div", {class: "figure"}, el("b", {text: value}), el("span", {text: label}));

  function chart(target, title, labels, colors) {
    const width = Math.max(260, target.clientWidth - 10);
    const opts = {title, width, height: 160, legend: {show: true}, scales: {x: {time: true}},
      series: [{}, ...labels.map((l, i) => ({label: l, stroke: colors[i], width: 1.5, spanGaps: true}))],
      axes: [{}, {size: 50}]};
    return new uPlot(opts, [[], ...labels.map(() => [])], target);
  }

  function card(row) {
    const figures = el("div", {class: "figures"});
    const c1 = el("div"), c2 = el("div"), c3 = el("div");
    const box = el("section", {class: "card engine", "data-engine": row.id},
      el("h2", {}, `${row.model} `, el("span", {class: "muted", text: row.id})), figures, c1, c2, c3);
    grid.append(box);
    const data = {t: [], tok: [], p50: [], p95: [], wait: [], run: [], kv: []};
    return {box, figures, data, plots: [
      chart(c1, "tokens/s generated", ["tokens/s"], ["#2f5bd3"]),
      chart(c2, "TTFT ms (last minute)", ["p50", "p95"], ["#1a7f37", "#c62828"]),
      chart(c3, "requests and KV cache", ["waiting", "running", "KV %"], ["#9a6700", "#2f5bd3", "#7b1fa2"]),
    ]};
  }

  function push(arr, v) { arr.push(v ?? null); if (arr.length > KEEP) arr.shift(); }

  function update(sample) {
    const g = sample.gateway;
    gw.replaceChildren(figure("requests/s", fmt(g.requests_s, 2)), figure("in flight", fmt(g.in_flight, 0)),
      figure("TTFT p50 (gateway)", fmt(g.ttft_p50_ms, 0, " ms")), figure("TTFT p95 (gateway)", fmt(g.ttft_p95_ms, 0, " ms")));
    gpu.textContent = sample.gpu_used_gib === null ? "GPU memory: no GPU probe on this machine" : `GPU memory used: ${sample.gpu_used_gib} GiB`;
    const now = Date.now() / 1000;
    const seen = new Set();
    for (const row of sample.engines) {
      seen.add(row.id);
      if (!cards.has(row.id)) cards.set(row.id, card(row));
      const c = cards.get(row.id);
      c.figures.replaceChildren(
        figure("tokens/s", fmt(row.tokens_s)), figure("TTFT p50", fmt(row.ttft_p50_ms, 0, " ms")),
        figure("TTFT p95", fmt(row.ttft_p95_ms, 0, " ms")), figure("waiting", fmt(row.waiting, 0)),
        figure("running", fmt(row.running, 0)), figure("KV cache use", fmt(row.kv_use_pct, 1, " %")),
        figure("prefix cache hits", fmt(row.prefix_hit_pct, 1, " %")), figure("state", row.state));
      const d = c.data;
      push(d.t, now); push(d.tok, row.tokens_s); push(d.p50, row.ttft_p50_ms); push(d.p95, row.ttft_p95_ms);
      push(d.wait, row.waiting); push(d.run, row.running); push(d.kv, row.kv_use_pct);
      c.plots[0].setData([d.t, d.tok]);
      c.plots[1].setData([d.t, d.p50, d.p95]);
      c.plots[2].setData([d.t, d.wait, d.run, d.kv]);
    }
    for (const [id, c] of cards) {
      if (!seen.has(id)) { c.box.remove(); cards.delete(id); }
    }
    empty.hidden = cards.size > 0;
  }

  api("/ui/api/live").then(update).catch((e) => notice(e.message, "error"));
  events(["live"], {live: update});
})();
