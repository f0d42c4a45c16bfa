"use strict";
// Playground: a streamed chat with any served model or adapter through the gateway (it shows in Activity).
(() => {
  const {el, api, post, errorOf, section, notice} = VS;
  const app = document.getElementById("app");
  const model = el("select", {id: "pg-model"});
  const temperature = el("input", {id: "pg-temperature", type: "number", min: "0", max: "2", step: "0.1", value: "0"});
  const maxTokens = el("input", {id: "pg-max-tokens", type: "number", min: "1", max: "4096", value: "64"});
  const system = el("input", {id: "pg-system", type: "text", placeholder: "system prompt (optional)", size: "40"});
  const prompt = el("textarea", {id: "pg-prompt", placeholder: "Ask something", text: "What is the capital of France?"});
  const send = el("button", {type: "submit", class: "primary", id: "pg-send", text: "Send"});
  const tool = el("button", {type: "button", id: "pg-tool", text: "Tool-call example"});
  const clear = el("button", {type: "button", id: "pg-clear", text: "Clear"});
  const chat = el("div", {class: "chat", id: "pg-chat"});
  const stats = el("p", {class: "muted", id: "pg-stats"});
  let history = [];
  // As in a chat: the settings on top, the conversation, then the input below it.
  const settings = el("div", {class: "row", id: "pg-settings"}, el("label", {}, "model", model),
    el("label", {}, "temperature", temperature), el("label", {}, "max tokens", maxTokens), el("label", {}, "system", system));
  const form = el("form", {id: "pg-form"}, prompt, el("div", {class: "row"}, send, tool, clear));
  app.replaceChildren(section("Playground", settings, chat, stats, form));

  const WEATHER = [{type: "function", function: {name: "get_weather", description: "The weather in a city now",
    parameters: {type: "object", properties: {city: {type: "string"}}, required: ["city"]}}}];

  async function stream(extra, userText) {
    const messages = [...(system.value ? [{role: "system", content: system.value}] : []), ...history,
      {role: "user", content: userText}];
    const bubble = el("div", {class: "msg assistant", "data-role": "assistant"});
    chat.append(el("div", {class: "msg user", text: userText}), bubble);
    send.disabled = tool.disabled = true;
    const t0 = performance.now();
    let first = null, text = "", calls = {}, usage = null;
    try {
      const resp = await post("/ui/api/chat", {model: model.value, messages, stream: true,
        temperature: Number(temperature.value), max_tokens: Number(maxTokens.value),
        stream_options: {include_usage: true}, ...extra});
      if (!resp.ok) throw await errorOf(resp);
      const reader = resp.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += dec.decode(value, {stream: true});
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const evt = buf.slice(0, cut); buf = buf.slice(cut + 2);
          for (const line of evt.split("\n")) {
            if (!line.startsWith("data:")) continue;
            const data = line.slice(5).trim();
            if (data === "[DONE]") continue;
            const chunk = JSON.parse(data);
            if (chunk.error) throw new Error(chunk.error.message || "the stream failed");
            if (chunk.usage) usage = chunk.usage;
            for (const choice of chunk.choices || []) {
              const delta = choice.delta || {};
              if (first === null && (delta.content || delta.tool_calls)) first = performance.now() - t0;
              if (delta.content) text += delta.content;
              for (const tc of delta.tool_calls || []) {
                const c = calls[tc.index] || (calls[tc.index] = {name: "", arguments: ""});
                if (tc.function && tc.function.name) c.name += tc.function.name;
                if (tc.function && tc.function.arguments) c.arguments += tc.function.arguments;
              }
            }
            const shown = Object.values(calls).map((c) => `→ tool call ${c.name}(${c.arguments})`);
            bubble.textContent = [text, ...shown].filter(Boolean).join("\n");
          }
        }
      }
      history.push({role: "user", content: userText}, {role: "assistant", content: text});
      const secs = (performance.now() - t0) / 1000;
      stats.textContent = `first token ${first === null ? "–" : first.toFixed(0) + " ms"} · ${secs.toFixed(1)} s` +
        (usage ? ` · ${usage.prompt_tokens} tokens in, ${usage.completion_tokens} out` : "");
      bubble.dataset.done = "1";
    } catch (e) {
      bubble.classList.add("error");
      bubble.textContent = e.message;
      bubble.dataset.done = "1";
      notice(e.message, "error");
    } finally {
      send.disabled = tool.disabled = false;
    }
  }

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = prompt.value.trim();
    if (!text) return;
    prompt.value = "";  // sent: it shows in the chat above, the box is free for the next message
    stream({}, text);
  });
  tool.addEventListener("click", () => stream({tools: WEATHER,
    tool_choice: {type: "function", function: {name: "get_weather"}}}, "What is the weather in Paris?"));
  clear.addEventListener("click", () => { history = []; chat.replaceChildren(); stats.textContent = ""; });
  api("/ui/api/models").then((v) => {
    const names = v.served || v.models.map((m) => m.model);
    names.forEach((n) => model.append(el("option", {value: n, text: n})));
    const wanted = new URLSearchParams(location.search).get("model");
    if (wanted && names.includes(wanted)) model.value = wanted;
    else if (names.includes(v.default)) model.value = v.default;
  }).catch((e) => notice(e.message, "error"));
})();
