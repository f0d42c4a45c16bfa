"use strict";
// Models: every configured model with its state, tier, memory and replicas (how they are picked, each one's KV
// index); admin buttons, confirmed.
(() => {
  const {el, api, post, errorOf, notice, confirm, events, fmt, section, table, role} = VS;
  const app = document.getElementById("app");
  const ACTIONS = {load: "Load", sleep: "Sleep", unload: "Unload", switch: "Switch to"};
  const WHAT = {
    load: "start it (co-resident if it fits, else other models make room)",
    sleep: "put it to sleep (or stop it where sleep mode is off)",
    unload: "stop its engine once its requests finish",
    switch: "make it the one awake model: load it, then put every other model to sleep or stop it",
  };
  let pending = null;

  async function act(model, action) {
    if (!await confirm(`${ACTIONS[action]} ${model}: ${WHAT[action]}?`)) return;
    const resp = await post(`/ui/api/models/${encodeURIComponent(model)}/${action}`);
    if (!resp.ok) { notice((await errorOf(resp)).message, "error"); return; }
    pending = `${action} ${model}`;
    notice(`${ACTIONS[action]} ${model}: accepted; the state below follows it live`, "ok");
  }

  // Level 1 keeps the weights in host RAM while asleep: said only where the model can sleep at all.
  function memory(m, sleeps) {
    const parts = [];
    if (m.need_gib !== null && m.need_gib !== undefined) parts.push(`${fmt(m.need_gib, 2)} GiB awake`);
    if (m.weights_gib) parts.push(`${fmt(m.weights_gib, 2)} GiB weights` + (sleeps ? " (host copy when asleep at level 1)" : ""));
    return parts.join("; ") || "–";
  }

  // The actions that can work in this state: Load when it is not loaded, Sleep only with sleep mode (never on
  // the CPU build), Unload while it holds (or is getting) an engine; Switch always.
  function offered(state, sleeps) {
    const loaded = state === "ready" || state === "starting";
    return Object.keys(ACTIONS).filter((a) =>
      (a === "load" && !loaded) || (a === "sleep" && sleeps && state === "ready") ||
      (a === "unload" && ["ready", "starting", "sleeping", "failed"].includes(state)) || a === "switch");
  }

  const count = (n) => (n ?? 0).toLocaleString("en-US");
  const plural = (n, one) => `${count(n)} ${one}${n === 1 ? "" : "s"}`;

  // What the gateway's KV index holds of one replica, from its engine's KV events (gateway.replica_routing:
  // kv_events): blocks × block size = the prompt tokens it can route to that replica's cache.
  function kvFigures(kv) {
    const held = kv.block_size ? `${plural(kv.blocks, "block")} × ${kv.block_size} = ${count(kv.blocks * kv.block_size)} tokens`
      : plural(kv.blocks, "block");
    return [`KV index ${kv.state}: ${held}`, `${count(kv.expected)} expected`,
      `stored ${count(kv.stored)}, removed ${count(kv.removed)}` + (kv.skipped ? `, skipped ${count(kv.skipped)}` : ""),
      `${plural(kv.replays, "replay")}, ${plural(kv.drops, "drop")}`].join(" · ");
  }

  // How its kv_events choices were made: by the caches, by the balance rule (gateway.kv_events_balance_threshold:
  // the least busy replica), or by prefix affinity (no tokens, or no replica's events live yet).
  function choiceFigures(made) {
    const parts = [["kv_events", "by cache"], ["balance", "to the least busy"], ["prefix_affinity", "by prefix hash"]]
      .filter(([k]) => made[k]).map(([k, what]) => `${count(made[k])} ${what}`);
    return `choices: ${parts.join(" · ")}`;
  }

  // A model with replicas: how the gateway picks one, then each replica with its node, state and KV index.
  function replicaCell(entry, replicas) {
    if (!replicas.length) {
      return el("td", {class: "nowrap", text: plural(entry.deployments.length, "deployment")});
    }
    return el("td", {class: "replicas"},
      entry.replica_routing ? el("div", {class: "muted", "data-routing": entry.replica_routing, text: `routing: ${entry.replica_routing}`}) : null,
      entry.replica_choices ? el("div", {class: "muted", "data-choices": "", text: choiceFigures(entry.replica_choices)}) : null,
      replicas.map((d) => el("div", {"data-replica": d.labels.replica},
        `r${d.labels.replica}@${d.labels.node} ${d.state}`,
        d.kv_events ? el("div", {class: "muted kv", text: kvFigures(d.kv_events)}) : null)));
  }

  function row(entry, mgr) {
    const m = entry.manager || {};
    const state = m.state || entry.state;
    const sleeps = Boolean(mgr && mgr.sleep_mode && m.can_sleep);
    const replicas = entry.deployments.filter((d) => d.labels && d.labels.replica);
    const buttons = offered(state, sleeps).map((a) => el("button", {
      type: "button", "data-action": a, "data-model": entry.model, disabled: role !== "admin" || !entry.manager,
      title: role !== "admin" ? "admin only: log in with the admin key" : WHAT[a], onclick: () => act(entry.model, a),
    }, ACTIONS[a]));
    const detail = [el("div", {text: m.detail || (entry.deployments[0] || {}).detail || ""})];
    if (state === "failed" && m.log_tail) {
      detail.push(el("details", {open: true}, el("summary", {text: "last engine log lines"}),
        el("pre", {class: "log-tail", text: m.log_tail})));
    }
    return el("tr", {"data-model": entry.model, "data-state": state},
      el("td", {}, el("strong", {class: "name", text: entry.model}), entry.aliases.length ? el("div", {class: "muted", text: `aliases: ${entry.aliases.join(", ")}`}) : null),
      el("td", {}, el("span", {class: `badge state state-${state}`, text: state}),
        m.for_s !== undefined ? el("div", {class: "muted", text: `for ${fmt(m.for_s, 0)} s`}) : null),
      el("td", {}, m.tier || "–", m.tier_reason ? el("div", {class: "muted", text: m.tier_reason}) : null),
      el("td", {text: memory(m, sleeps)}),
      replicaCell(entry, replicas),
      el("td", {class: "num", text: `${m.in_flight ?? 0} / ${m.queued ?? 0}`}),
      el("td", {}, detail),
      el("td", {}, el("div", {class: "actions"}, buttons)));
  }

  function render(view) {
    const mgr = view.manager;
    const rows = view.models.map((entry) => row(entry, mgr));
    app.replaceChildren(
      section("Models",
        el("p", {class: "muted"}, `default: ${view.default}`, mgr ? ` · capacity ${fmt(mgr.capacity_gib, 2)} GiB · sleep mode ${mgr.sleep_mode ? "on" : "off"}` +
          (mgr.host_budget_gib !== null ? ` · host budget ${fmt(mgr.host_budget_gib, 2)} GiB` : "") : "",
          role !== "admin" ? " · read-only: the buttons need the admin role" : ""),
        table(["model", "state", "tier", "memory", "replicas", "in flight / queued", "detail", "actions"], rows, {id: "models"})));
  }

  api("/ui/api/models").then(render).catch((e) => notice(e.message, "error"));
  events(["models"], {models: (view) => { render(view); if (pending) pending = null; }});
})();
