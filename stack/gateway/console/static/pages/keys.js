"use strict";
// Keys: the named keys (tenants) with their role, models, priority, limits and what each used (this minute,
// today, in all, money on the cloud); an admin adds one (the key is shown once, never again) and revokes one.
// The admin role only, as /admin/keys: a viewer gets a sentence saying so and no call is made for it.
(() => {
  const {el, api, post, errorOf, fmt, section, table, notice, confirm, role} = VS;
  const app = document.getElementById("app");
  const view = el("div", {id: "keys-view"});
  app.replaceChildren(view);
  if (role !== "admin") {
    view.append(section("Named keys", el("p", {class: "muted", id: "keys-admin-only",
      text: "The named keys are shown to the admin role only: log in with the admin key to list, add or revoke them."})));
    return;
  }
  const LIMITS = [["rpm", "requests/min"], ["tpm", "tokens/min"], ["concurrent", "concurrent"],
    ["tokens_per_day", "tokens/day"], ["token_budget", "token budget"], ["budget_usd", "budget $"]];
  const body = el("tbody");
  const tbl = table(["name", "role", "models", "priority", "limits", "requests/min", "tokens/min", "tokens today",
    "tokens in all", "cost $", ""], []);
  tbl.querySelector("table").id = "keys";
  tbl.querySelector("tbody").replaceWith(body);
  const empty = el("p", {class: "muted", id: "keys-empty", text: "No named key yet: add one below."});
  const revoked = el("p", {class: "muted", id: "keys-revoked"});

  // The add form: every field optional but the name; empty limits are no limit.
  const name = el("input", {id: "key-name", type: "text", required: true, pattern: "[A-Za-z0-9][A-Za-z0-9._\\-]{0,63}", size: "14"});
  const roleSel = el("select", {id: "key-role"}, ["client", "viewer", "admin"].map((r) => el("option", {value: r, text: r})));
  const prio = el("select", {id: "key-priority"}, ["normal", "high", "low"].map((p) => el("option", {value: p, text: p})));
  const models = el("input", {id: "key-models", type: "text", placeholder: "every model", size: "18"});
  const spill = el("input", {id: "key-spill", type: "checkbox"});
  const limitInputs = Object.fromEntries(LIMITS.map(([k]) => [k, el("input", {id: `key-${k.replaceAll("_", "-")}`,
    type: "number", min: "0", step: k === "budget_usd" ? "any" : "1", size: "8", placeholder: "none"})]));
  const add = el("button", {type: "submit", class: "primary", id: "key-add", text: "Add key"});
  const form = el("form", {id: "key-form"},
    el("div", {class: "row"}, el("label", {}, "name", name), el("label", {}, "role", roleSel),
      el("label", {}, "priority", prio), el("label", {}, "models (comma-separated)", models),
      el("label", {}, "spill to the cloud over a limit", spill)),
    el("div", {class: "row"}, LIMITS.map(([k, label]) => el("label", {}, label, limitInputs[k])), add));
  const secret = el("div", {id: "new-key-box", hidden: true});
  view.append(section("Named keys", tbl, empty, revoked), section("Add a key", form, secret));

  function limitsText(limits) {
    const parts = LIMITS.filter(([k]) => limits[k] !== undefined).map(([k, label]) =>
      k === "budget_usd" ? `budget $${limits[k]}` : `${label} ${Number(limits[k]).toLocaleString("en-US")}`);
    return parts.length ? parts.join(", ") : "none";
  }

  function tr(k) {
    const revoke = el("button", {type: "button", "data-revoke": k.name, text: "Revoke", onclick: () => revokeKey(k.name)});
    return el("tr", {"data-key": k.name, "data-source": k.source},
      el("td", {class: "name", text: k.name}), el("td", {}, el("span", {class: `badge role-${k.role}`, text: k.role})),
      el("td", {class: "models", text: k.models.length ? k.models.join(", ") : "every model"}),
      el("td", {class: "priority", text: k.priority}), el("td", {class: "limits", text: limitsText(k.limits)}),
      el("td", {class: "num", "data-figure": "requests_last_minute", text: fmt(k.requests_last_minute, 0)}),
      el("td", {class: "num", "data-figure": "tokens_last_minute", text: fmt(k.tokens_last_minute, 0)}),
      el("td", {class: "num", "data-figure": "tokens_today", text: fmt(k.tokens_today, 0)}),
      el("td", {class: "num", "data-figure": "tokens_total", text: fmt(k.tokens_total, 0)}),
      el("td", {class: "num", "data-figure": "cost_usd", text: fmt(k.cost_usd, 4)}), el("td", {}, revoke));
  }

  async function load() {
    try {
      const data = await api("/ui/api/keys");
      body.replaceChildren(...data.keys.map(tr));
      empty.hidden = data.keys.length > 0;
      revoked.textContent = data.revoked.length ? `revoked: ${data.revoked.join(", ")}` : "";
      view.dataset.loaded = String(Number(view.dataset.loaded || 0) + 1);
    } catch (e) { notice(e.message, "error"); }
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const limits = {};
    for (const [k] of LIMITS) if (limitInputs[k].value !== "") limits[k] = Number(limitInputs[k].value);
    const spec = {name: name.value.trim(), role: roleSel.value, priority: prio.value, spill: spill.checked, limits,
      models: models.value.split(",").map((m) => m.trim()).filter(Boolean)};
    add.disabled = true;
    try {
      const resp = await post("/ui/api/keys", spec);
      if (!resp.ok) throw await errorOf(resp);
      const answer = await resp.json();
      // Shown this once: the gateway keeps only its SHA-256; the box goes with the next add or a reload.
      secret.replaceChildren(el("p", {}, `Key for ${answer.name} (copy it now: it is not shown again):`),
        el("pre", {id: "new-key", text: answer.key}), el("p", {class: "muted", text: answer.note}));
      secret.hidden = false;
      form.reset();
      notice(`key ${answer.name} added`, "ok");
      await load();
    } catch (e) { notice(e.message, "error"); } finally { add.disabled = false; }
  });

  async function revokeKey(keyName) {
    if (!await confirm(`Revoke key ${keyName}? Its requests are refused from now on (401), also after a restart.`)) return;
    try {
      const resp = await post(`/ui/api/keys/${encodeURIComponent(keyName)}/revoke`);
      if (!resp.ok) throw await errorOf(resp);
      notice(`key ${keyName} revoked`, "ok");
      await load();
    } catch (e) { notice(e.message, "error"); }
  }

  load();
  setInterval(load, 5000);
})();
