"use strict";
document.getElementById("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const box = document.getElementById("login-error");
  const key = document.getElementById("key");
  box.hidden = true;
  const resp = await fetch("/ui/login", {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({key: key.value}),
  });
  key.value = "";
  if (!resp.ok) {
    const body = await resp.json().catch(() => ({}));
    box.textContent = (body.error && body.error.message) || `login failed (${resp.status})`;
    box.hidden = false;
    return;
  }
  const next = new URLSearchParams(location.search).get("next") || "/ui/models";
  location.assign(next.startsWith("/ui/") ? next : "/ui/models");
});
