"use strict";
// Plan & config: the effective configuration (redacted like `vstack config render`), each model's fit and the
// planner's reasons, the exact vLLM command line, the switch history, the patch ledger, the latest reports.
(() => {
  const {el, api, fmt, section, table, time, notice} = VS;
  const app = document.getElementById("app");
  const missing = (what) => el("p", {class: "muted", text: `${what}: not available in this gateway process`});

  function engines(list) {
    if (!list) return [missing("model plans")];
    return list.map((e) => section(`${e.model}${e.default ? " (default)" : ""}`,
      el("p", {}, el("strong", {text: "vLLM command: "})),
      el("pre", {class: "command", text: e.command}),
      e.fit ? el("p", {}, `fit on ${e.fit.hardware}: `, el("span", {text: e.fit.summary})) : el("p", {class: "muted", text: "fit: not planned"}),
      e.fit && e.fit.decisions.length ? table(["setting", "value", "from", "why"], e.fit.decisions.map((d) =>
        el("tr", {}, el("td", {text: d.key}), el("td", {text: String(d.value)}), el("td", {text: d.source}), el("td", {text: d.reason})))) : null,
      e.notes.length ? el("details", {}, el("summary", {text: `planner notes (${e.notes.length})`}),
        el("ul", {}, e.notes.map((n) => el("li", {text: n})))) : null));
  }

  function switches(rows, manager) {
    if (!rows.length) return el("p", {class: "muted", text: "No switch yet since the gateway started."});
    return table(["at", "model", "kind", "seconds", "phases", "bus limit", "reason"], rows.map((s) => el("tr", {},
      el("td", {text: time(s.at)}), el("td", {text: s.model}), el("td", {text: s.kind}), el("td", {class: "num", text: fmt(s.seconds, 2)}),
      el("td", {text: Object.entries(s.phases || {}).map(([k, v]) => `${k} ${fmt(v, 2)} s`).join(", ") || "–"}),
      el("td", {text: s.bus_floor_s !== undefined && s.bus_floor_s !== null ? `≥ ${fmt(s.bus_floor_s, 2)} s at ${s.bus_gbps} GB/s` : "– (no GPU bus: CPU engines start cold)"}),
      el("td", {text: s.reason || ""}))));
  }

  function patches(p) {
    if (!p) return missing("patch ledger");
    if (p.error) return el("p", {class: "error", text: p.error});
    return [el("p", {class: "muted", text: p.installation}), table(["id", "kind", "state", "detail"], p.patches.map((r) =>
      el("tr", {}, el("td", {text: r.id}), el("td", {text: r.kind}), el("td", {text: r.state}), el("td", {text: r.detail}))))];
  }

  // configs/hardware as a table, one profile a row; the rest of the configuration stays JSON below it.
  function hardware(profiles) {
    const rows = Object.entries(profiles || {}).map(([name, h]) => el("tr", {"data-hardware": name},
      el("td", {}, el("strong", {class: "name", text: name})), el("td", {text: h.accelerator}),
      el("td", {class: "num", text: h.accelerator === "gpu" ? String(h.gpu_count) : "–"}),
      el("td", {class: "num", text: h.memory_gib ? `${fmt(h.memory_gib, 0)} GiB` : "–"}),
      el("td", {class: "num", text: h.bandwidth_gbps ? `${fmt(h.bandwidth_gbps, 0)} GB/s` : "–"}),
      el("td", {text: (h.match || []).join(", ") || "–"}), el("td", {text: h.description || ""})));
    if (!rows.length) return el("p", {class: "muted", text: "No hardware profile configured."});
    return table(["profile", "device", "GPUs", "memory per GPU", "bandwidth", "matches", "description"], rows, {id: "hardware"});
  }

  function configuration(config) {
    if (!config) return missing("configuration");
    const {hardware: _hardware, ...rest} = config;
    return el("details", {}, el("summary", {text: "the rest of the configuration (JSON: models, profiles, gateway, manager, ...)"}),
      el("pre", {id: "config", text: JSON.stringify(rest, null, 2)}));
  }

  function reports(list) {
    if (!list) return missing("reports");
    if (!list.length) return el("p", {class: "muted", text: "No tune or load report found (vstack tune / vstack bench write them under results/)."});
    return list.map((r) => el("details", {},
      el("summary", {}, `${r.kind}: ${r.name} `, el("span", {class: "muted", text: `${r.path} · ${time(r.modified)}`})),
      el("pre", {text: r.text}),
      ...(r.plots || []).map((p) => el("img", {src: `/ui/api/reports/${r.index}/${encodeURIComponent(p)}`, alt: p, style: null, width: "100%"}))));
  }

  api("/ui/api/plan").then((d) => {
    app.replaceChildren(
      el("h1", {text: "Plan & config"}),
      ...engines(d.engines),
      section("Switch history", switches(d.switches, d.manager),
        d.decisions.length ? el("details", {}, el("summary", {text: "the manager's last decisions"}), el("pre", {text: JSON.stringify(d.decisions, null, 2)})) : null),
      section("Patch ledger", patches(d.patches)),
      section("Latest tune and load reports", reports(d.reports)),
      section("Hardware profiles", d.config ? hardware(d.config.hardware) : missing("hardware profiles")),
      section("Effective configuration (secrets masked)", configuration(d.config)));
  }).catch((e) => notice(e.message, "error"));
})();
