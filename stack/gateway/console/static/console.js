"use strict";
// Shared by every console page: calls to /ui/api (cookie + CSRF token), the event stream, small DOM helpers.
const VS = (() => {
  const meta = (name) => (document.querySelector(`meta[name="${name}"]`) || {}).content || "";
  const csrf = meta("csrf-token");
  const role = meta("console-role");
  const who = meta("console-who");

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  async function errorOf(resp) {
    const body = await resp.json().catch(() => ({}));
    const err = body.error || {};
    return new Error(err.message || `${resp.status} ${resp.statusText}`);
  }

  async function api(path, opts = {}) {
    const resp = await fetch(path, {credentials: "same-origin", ...opts});
    if (resp.status === 401) { location.assign(`/ui/login?next=${encodeURIComponent(location.pathname)}`); }
    if (!resp.ok) throw await errorOf(resp);
    return resp.json();
  }

  function post(path, body) {
    return fetch(path, {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
      body: JSON.stringify(body || {}),
    });
  }

  function notice(text, kind = "info") {
    const box = document.getElementById("notice");
    box.textContent = text;
    box.className = kind;
    box.hidden = false;
    clearTimeout(notice.timer);
    if (kind !== "error") notice.timer = setTimeout(() => { box.hidden = true; }, 6000);
  }

  function confirmDialog(text) {
    const dlg = document.getElementById("confirm");
    document.getElementById("confirm-text").textContent = text;
    return new Promise((resolve) => {
      dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), {once: true});
      dlg.showModal();
    });
  }

  // One stream per page; the browser reconnects by itself (retry: 3000) after a gateway restart.
  function events(topics, handlers) {
    const src = new EventSource(`/ui/api/events?topics=${topics.join(",")}`);
    for (const [topic, fn] of Object.entries(handlers)) {
      src.addEventListener(topic, (ev) => fn(JSON.parse(ev.data)));
    }
    src.addEventListener("open", () => { document.body.classList.remove("offline"); document.body.dataset.live = "1"; });
    src.addEventListener("error", () => document.body.classList.add("offline"));
    window.addEventListener("beforeunload", () => src.close());
    return src;
  }

  const fmt = (v, digits = 1, unit = "") =>
    v === null || v === undefined ? "–" : `${typeof v === "number" ? v.toFixed(digits) : v}${unit}`;
  const time = (ts) => new Date(ts * 1000).toLocaleTimeString();

  function section(title, ...children) {
    return el("section", {class: "card"}, el("h2", {text: title}), ...children);
  }

  function table(cols, rows, attrs = {}) {
    return el("div", {class: "scroll"}, el("table", attrs,
      el("thead", {}, el("tr", {}, cols.map((c) => el("th", {text: c})))),
      el("tbody", {}, rows)));
  }

  // Header: the role, and log in / log out where they mean something.
  document.addEventListener("DOMContentLoaded", () => {
    const login = document.getElementById("login-link");
    const logout = document.getElementById("logout");
    if (!login) return;
    // One of the two, never both: a session with a key logs out (then logs in with another key, the admin
    // key for the buttons); a page without one logs in.
    const loggedIn = Boolean(who) && who !== "none";
    login.hidden = loggedIn || !(meta("console-login") && role !== "admin");
    logout.hidden = !loggedIn;
    logout.addEventListener("click", async () => {
      await post("/ui/logout");
      location.assign("/ui/login");
    });
  });

  return {el, api, post, errorOf, notice, confirm: confirmDialog, events, fmt, time, section, table, role, csrf};
})();
