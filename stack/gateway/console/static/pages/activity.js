"use strict";
// Activity: the last requests (no bodies, no keys), filtered by model and status, exportable; new ones arrive live.
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
  app.replaceChildren(section("Activity",
    el("div", {class: "row"}, el("label", {}, "model", model), el("label", {}, "status", status),
      el("span", {}, "export: ", csv, " · ", json)),
    tbl));

  const query = () => {
    const q = new URLSearchParams();
    if (model.value) q.set("model", model.value);
    if (status.value) q.set("status", status.value);
    return q;
  };
  const matches = (r) => (!model.value || r.model === model.value) &&
    (!status.value || (status.value === "ok") === r.status.startsWith("2"));

  function tr(r) {
    return el("tr", {"data-id": r.id, "data-model": r.model, "data-status": r.status, "data-tenant": r.tenant || ""},
      el("td", {text: time(r.ts)}), el("td", {text: r.tenant || "–"}), el("td", {text: r.model}), el("td", {text: r.route, title: r.why || ""}),
      el("td", {class: r.status.startsWith("2") ? "" : "error", text: r.status}),
      el("td", {class: "num", text: fmt(r.ttft_ms, 0, " ms")}), el("td", {class: "num", text: fmt(r.tokens_in, 0)}),
      el("td", {class: "num", text: fmt(r.tokens_out, 0)}), el("td", {class: "num", text: fmt(r.duration_ms, 0, " ms")}),
      el("td", {text: r.deployment}), el("td", {text: r.endpoint}));
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
