"use strict";
// Usage: per named key (tenant) and model since the gateway started (requests, errors, refused, spilled, tokens,
// cost), tokens per minute of the last hour per tenant as a chart, and the table as CSV or JSON.
(() => {
  const {el, api, fmt, section, table, notice} = VS;
  const app = document.getElementById("app");
  const csv = el("a", {id: "usage-csv", download: "usage.csv", href: "/ui/api/usage?format=csv", text: "CSV"});
  const json = el("a", {id: "usage-json", download: "usage.json", href: "/ui/api/usage", text: "JSON"});
  const body = el("tbody");
  const tbl = table(["tenant", "model", "requests", "errors", "refused", "spilled", "tokens in", "tokens out", "cost $"], []);
  tbl.querySelector("table").id = "usage";
  tbl.querySelector("tbody").replaceWith(body);
  const plotBox = el("div", {id: "usage-chart", "data-chart": "tokens"});
  const empty = el("p", {class: "muted", id: "usage-empty", text: "No request has been counted yet."});
  app.replaceChildren(section("Usage per tenant and model", el("div", {class: "row"}, el("span", {}, "export: ", csv, " · ", json)),
    tbl, empty), section("Tokens per minute (last hour)", plotBox));
  const COLORS = ["#2f5bd3", "#c62828", "#1a7f37", "#9a6700", "#7b1fa2", "#00838f", "#5d4037", "#455a64"];
  const clock = (s) => new Date(s * 1000).toLocaleTimeString([], {hour: "2-digit", minute: "2-digit", hour12: false});
  let plot = null, names = "";

  function tr(r) {
    return el("tr", {"data-tenant": r.tenant, "data-model": r.model},
      el("td", {text: r.tenant}), el("td", {text: r.model}), el("td", {class: "num", text: fmt(r.requests, 0)}),
      el("td", {class: "num" + (r.errors ? " error" : ""), text: fmt(r.errors, 0)}), el("td", {class: "num", text: fmt(r.refused, 0)}),
      el("td", {class: "num", text: fmt(r.spilled, 0)}), el("td", {class: "num", text: fmt(r.tokens_in, 0)}),
      el("td", {class: "num", text: fmt(r.tokens_out, 0)}), el("td", {class: "num", text: fmt(r.cost_usd, 4)}));
  }

  // One line per tenant; rebuilt when the set of tenants changes, else its data replaced.
  function draw(series) {
    const tenants = Object.keys(series.tenants);
    const data = [series.t, ...tenants.map((n) => series.tenants[n])];
    plotBox.dataset.points = String(tenants.reduce((n, t) => n + series.tenants[t].filter((v) => v > 0).length, 0));
    if (plot && names === tenants.join(",")) { plot.setData(data); return; }
    if (plot) plot.destroy();
    names = tenants.join(",");
    plot = new uPlot({title: "tokens per minute", width: Math.max(320, plotBox.clientWidth - 10), height: 220,
      scales: {x: {time: false}, y: {range: (u, min, max) => [0, max > 0 ? max * 1.15 : 1]}},
      series: [{label: "time", value: (u, v) => v === null ? "–" : clock(v)},
        ...tenants.map((n, i) => ({label: n, stroke: COLORS[i % COLORS.length], width: 1.5}))],
      axes: [{values: (u, ticks) => ticks.map(clock), space: 70}, {size: 64, label: "tokens/min", labelSize: 16}]},
    data, plotBox);
    plotBox.plot = plot;
  }

  async function load() {
    try {
      const data = await api("/ui/api/usage");
      body.replaceChildren(...data.usage.map(tr));
      empty.hidden = data.usage.length > 0;
      draw(data.per_minute);
    } catch (e) { notice(e.message, "error"); }
  }
  load();
  setInterval(load, 5000);
})();
