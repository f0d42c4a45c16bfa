"use strict";
// Activity: the last requests (no bodies, no keys), filtered by model and status, exportable; new ones arrive live.
// A row with a trace opens its timeline: the gateway's spans of that request as a waterfall (adr/0042).
(() => {
  const {el, api, events, fmt, section, table, time, notice} = VS;
  const app = document.getElementById("app");
  const model = el("select", {id: "filter-model"}, el("option", {value: "", text: "all models"}));
  const status = el("select", {id: "filter-status"},
    ["", "ok", "error"].map((s) => el("option", {value: s, text: s || "all statuses"})));
  const csv = el("a", {id: "export-csv", download: "activity.csv", text: "CSV"});
  const json = el("a", {id: "export-json", download: "activity.json", text: "JSON"});
  const body = el("tbody");
  const tbl = table(["time", "tenant", "model", "route", "status", "TTFT", "tokens in", "tokens out", "duration", "deployment", "endpoint"], []);
  tbl.querySelector("table").id = "activity";
  tbl.querySelector("tbody").replaceWith(body);
  const timeline = el("div", {id: "timeline", hidden: true});
  app.replaceChildren(section("Activity",
    el("div", {class: "row"}, el("label", {}, "model", model), el("label", {}, "status", status),
      el("span", {}, "export: ", csv, " · ", json)),
    tbl), timeline);

  const query = () => {
    const q = new URLSearchParams();
    if (model.value) q.set("model", model.value);
    if (status.value) q.set("status", status.value);
    return q;
  };
  const matches = (r) => (!model.value || r.model === model.value) &&
    (!status.value || (status.value === "ok") === r.status.startsWith("2"));

  function tr(r) {
    return el("tr", {"data-id": r.id, "data-model": r.model, "data-status": r.status, "data-tenant": r.tenant || "",
                     "data-trace": r.trace_id || null, class: r.trace_id ? "traced" : null,
                     title: r.trace_id ? "open this request's timeline" : null,
                     onclick: r.trace_id ? () => openTimeline(r) : null},
      el("td", {text: time(r.ts)}), el("td", {text: r.tenant || "–"}), el("td", {text: r.model}), el("td", {text: r.route, title: r.why || ""}),
      el("td", {class: r.status.startsWith("2") ? "" : "error", text: r.status}),
      el("td", {class: "num", text: fmt(r.ttft_ms, 0, " ms")}), el("td", {class: "num", text: fmt(r.tokens_in, 0)}),
      el("td", {class: "num", text: fmt(r.tokens_out, 0)}), el("td", {class: "num", text: fmt(r.duration_ms, 0, " ms")}),
      el("td", {text: r.deployment}), el("td", {text: r.endpoint}));
  }

  // Spans as rows: indented under their parent, a bar placed on the request's clock (CSSOM, no inline styles).
  function depthOf(spans) {
    const byId = new Map(spans.map((s) => [s.span_id, s]));
    const depth = (s, n = 0) => (s.parent_id && byId.has(s.parent_id) && n < 20 ? depth(byId.get(s.parent_id), n + 1) : n);
    return (s) => depth(s);
  }

  function barRow(span, depth, total) {
    const bar = el("div", {class: span.error ? "bar error-bar" : `bar kind-${span.kind}`,
                           title: `${span.name}: ${fmt(span.duration_ms, 2, " ms")} from ${fmt(span.start_ms, 2, " ms")}`});
    bar.style.left = `${Math.min(100, (span.start_ms / total) * 100)}%`;
    bar.style.width = `${Math.max(0.3, (span.duration_ms / total) * 100)}%`;
    const track = el("div", {class: "track"}, bar,
      span.events.map((e) => { const m = el("div", {class: "mark", title: e.name}); m.style.left = `${(e.at_ms / total) * 100}%`; return m; }));
    const name = el("td", {class: "span-name", text: span.name});
    name.style.paddingLeft = `${0.5 + depth * 1.1}rem`;
    const attrs = Object.entries(span.attributes).map(([k, v]) => `${k}=${v}`).join("\n");
    return el("tr", {"data-span": span.name, title: attrs},
      name, el("td", {class: "num", text: fmt(span.duration_ms, 2, " ms")}), el("td", {class: "waterfall"}, track),
      el("td", {class: span.error ? "error" : "muted", text: span.error || ""}));
  }

  async function openTimeline(r) {
    try {
      const t = await api(`/ui/api/trace/${encodeURIComponent(r.id)}`);
      const spans = [...t.spans, ...(t.switch || []).map((s) => ({...s, name: `switch: ${s.name}`}))];
      const total = Math.max(...spans.map((s) => s.start_ms + s.duration_ms), 0.001);
      const depth = depthOf(spans);
      const root = t.spans[0];
      const tbody = el("tbody", {}, spans.map((s) => barRow(s, depth(s), total)));
      timeline.replaceChildren(section(`Request ${r.id}: ${r.model}, ${fmt(root.duration_ms, 1, " ms")}`,
        el("p", {class: "muted"}, `trace ${t.trace_id}`, t.sampled ? " (exported)" : " (kept here only)",
          " · hover a phase for its attributes"),
        el("div", {class: "scroll"}, el("table", {id: "waterfall"},
          el("thead", {}, el("tr", {}, ["phase", "duration", "timeline", ""].map((h) => el("th", {text: h})))), tbody))));
      timeline.hidden = false;
      timeline.scrollIntoView({block: "nearest"});
    } catch (e) {
      notice(e.message, "error");
    }
  }

  function addModel(name) {
    if (![...model.options].some((o) => o.value === name)) model.append(el("option", {value: name, text: name}));
  }

  async function load() {
    const q = query();
    const qs = q.toString();
    csv.href = `/ui/api/activity?${qs}${qs ? "&" : ""}format=csv`;
    json.href = `/ui/api/activity?${qs}`;
    const data = await api(`/ui/api/activity?${qs}`);
    body.replaceChildren(...data.requests.map(tr));
  }

  model.addEventListener("change", load);
  status.addEventListener("change", load);
  api("/ui/api/models").then((v) => (v.served || v.models.map((m) => m.model)).forEach(addModel))
    .then(load).catch((e) => notice(e.message, "error"));
  events(["activity"], {activity: (rows) => {  // the requests of the last second, oldest first
    for (const r of rows) {
      addModel(r.model);
      if (matches(r) && !body.querySelector(`tr[data-id="${r.id}"]`)) body.prepend(tr(r));
    }
    while (body.children.length > 500) body.lastChild.remove();
  }});
})();
