"use strict";
// Logs: the gateway's log and each engine's, followed live, with a filter.
(() => {
  const {el, api, events, section, notice} = VS;
  const app = document.getElementById("app");
  const KEEP = 2000;
  const source = el("select", {id: "log-source"});
  const filter = el("input", {id: "log-filter", type: "search", placeholder: "filter (text)"});
  const follow = el("input", {id: "log-follow", type: "checkbox", checked: true});
  const pre = el("pre", {class: "log", id: "log"});
  let lines = [];
  app.replaceChildren(section("Logs",
    el("div", {class: "row"}, el("label", {}, "log", source), el("label", {}, "filter", filter),
      el("label", {}, el("span", {}, follow, " follow"))), pre));

  function draw() {
    const f = filter.value.toLowerCase();
    pre.textContent = (f ? lines.filter((l) => l.toLowerCase().includes(f)) : lines).join("\n");
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
  }

  async function load() {
    const data = await api(`/ui/api/logs?source=${encodeURIComponent(source.value || "gateway")}`);
    if (!source.options.length) {
      data.sources.forEach((s) => source.append(el("option", {value: s, text: s})));
      const wanted = new URLSearchParams(location.search).get("source");
      if (wanted && data.sources.includes(wanted)) { source.value = wanted; return load(); }
    }
    lines = data.lines;
    draw();
  }

  source.addEventListener("change", () => {
    history.replaceState(null, "", `?source=${encodeURIComponent(source.value)}`);
    load().catch((e) => notice(e.message, "error"));
  });
  filter.addEventListener("input", draw);
  load().catch((e) => notice(e.message, "error"));
  events(["log"], {log: (ev) => {
    if (ev.source !== (source.value || "gateway")) return;
    const recent = new Set(lines.slice(-500));  // the stream may repeat what the first load read
    lines = lines.concat(ev.lines.filter((l) => !recent.has(l))).slice(-KEEP);
    draw();
  }});
})();
