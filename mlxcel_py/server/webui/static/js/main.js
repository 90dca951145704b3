// The chat page: wiring of the composer, the conversation, the sidebar and the panels.
import { ApiError, getJSON, health, setApiKey, streamChat } from "/webui/js/api.js";
import { bindSettings, showDefaults, showServerInfo, togglePanel, watchSlots } from "/webui/js/panels.js";
import * as store from "/webui/js/store.js";
import { renderSidebar } from "/webui/js/sidebar.js";
import { LiveTurn, replyStats, turnElement } from "/webui/js/turns.js";

const $ = (id) => document.getElementById(id);
const HEALTH_EVERY_MS = 2000;
const NUMBER_FIELDS = { temperature: parseFloat, top_p: parseFloat, top_k: parseInt, min_p: parseFloat,
  max_tokens: parseInt, seed: parseInt };

const state = { conversation: null, controller: null, settings: null };

function notice(text) {
  $("notice").textContent = text || "";
  $("notice").hidden = !text;
}

/** The request body: the system prompt, the turns so far, and the sampling fields that are set. */
function requestBody(messages) {
  const s = state.settings;
  const turns = messages.filter((m) => m.content).map(({ role, content }) => ({ role, content }));
  const body = { messages: s.system.trim() ? [{ role: "system", content: s.system }, ...turns] : turns };
  for (const [name, parse] of Object.entries(NUMBER_FIELDS)) {
    const value = parse(s[name]);
    if (s[name].trim() !== "" && Number.isFinite(value)) body[name] = value;
  }
  return body;
}

function render() {
  const messages = state.conversation.messages;
  const lastUser = messages.findLastIndex((m) => m.role === "user");
  const idle = !state.controller;
  const last = messages.length - 1;
  $("messages").replaceChildren(...messages.map((message, i) => turnElement(message, {
    edit: idle && i === lastUser ? (text) => editLast(i, text) : null,
    regenerate: idle && i === last && message.role === "assistant" ? regenerate : null,
  })));
  $("messages").lastElementChild?.scrollIntoView({ block: "end" });
  renderSidebar($("conversations"), state.conversation.id, { open, rename: store.renameConversation, remove });
}

function setBusy(busy) {
  $("send").textContent = busy ? "Stop" : "Send";
  $("send").classList.toggle("stop", busy);
  $("new-chat").disabled = busy;
}

function askKey() {
  $("key-input").value = state.settings.api_key;
  if (!$("key-dialog").open) $("key-dialog").showModal();
}

/** Stream a reply to the conversation as it stands; the partial text stays if it is stopped. */
async function generate() {
  const conversation = state.conversation;
  const reply = { role: "assistant", content: "" };
  const body = requestBody(conversation.messages);
  conversation.messages.push(reply);
  state.controller = new AbortController();
  setBusy(true);
  render();
  const live = new LiveTurn($("messages").lastElementChild);
  const started = performance.now();
  let first = null, usage = null, timings = null;
  try {
    await streamChat(body, {
      signal: state.controller.signal,
      onFrame(frame) {
        if (frame.prompt_progress) live.progress(frame.prompt_progress);
        const delta = frame.choices?.[0]?.delta?.content;
        if (delta) {
          first ??= performance.now();
          reply.content += delta;
          live.append(delta);
        }
        usage = frame.usage || usage;
        timings = frame.timings || timings;
      },
    });
  } catch (error) {
    if (error.name === "AbortError") reply.stopped = true;
    else reply.error = error.message;
    if (error instanceof ApiError && error.status === 401) askKey();
  }
  reply.stats = replyStats(usage, timings, first === null ? null : first - started);
  state.controller = null;
  setBusy(false);
  store.saveConversation(conversation);
  render();
}

function send() {
  if (state.controller) {
    state.controller.abort();
    return;
  }
  const text = $("input").value;
  if (!text.trim()) return;
  $("input").value = "";
  state.conversation.messages.push({ role: "user", content: text });
  store.saveConversation(state.conversation);
  generate();
}

function regenerate() {
  const messages = state.conversation.messages;
  if (messages.at(-1)?.role === "assistant") messages.pop();
  generate();
}

function editLast(index, text) {
  const messages = state.conversation.messages;
  messages.splice(index, messages.length - index, { role: "user", content: text });
  store.saveConversation(state.conversation);
  generate();
}

function open(id) {
  if (state.controller) state.controller.abort();
  state.conversation = store.getConversation(id) || store.newConversation();
  store.setCurrentId(state.conversation.id);
  render();
}

function remove(id) {
  store.deleteConversation(id);
  if (id === state.conversation.id) state.conversation = store.listConversations()[0] || store.newConversation();
  render();
}

function newChat() {
  state.conversation = store.newConversation();
  store.setCurrentId(state.conversation.id);
  render();
  $("input").focus();
}

function exportAll() {
  const url = URL.createObjectURL(new Blob([store.exportJSON()], { type: "application/json" }));
  const link = Object.assign(document.createElement("a"), { href: url, download: "mlxcel-conversations.json" });
  link.click();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

async function importFile(file) {
  try {
    notice(`Imported ${store.importJSON(await file.text())} conversations.`);
    render();
  } catch (error) {
    notice(`Import failed: ${error.message}`);
  }
}

/** /health until ready, then the model's facts; a 401 asks for the key. */
async function watchServer() {
  const status = await health();
  $("server-status").textContent = status === "ok" ? "ready" : status === "loading" ? "loading the model…" : status;
  $("server-status").dataset.status = status;
  if (status !== "ok") {
    setTimeout(watchServer, HEALTH_EVERY_MS);
    return;
  }
  try {
    const [models, props] = await Promise.all([getJSON("/v1/models"), getJSON("/props")]);
    $("model-name").textContent = models.data?.[0]?.id ?? "";
    showServerInfo($("server-info"), models, props);
    showDefaults($("settings"), props);
    notice("");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) askKey();
    else notice(`Server: ${error.message}`);
  }
}

function wire() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      if (!state.controller) send();
    }
  });
  $("new-chat").addEventListener("click", newChat);
  $("export").addEventListener("click", exportAll);
  $("import-button").addEventListener("click", () => $("import").click());
  $("import").addEventListener("change", (event) => event.target.files[0] && importFile(event.target.files[0]));
  $("key-form").addEventListener("submit", () => {
    $("settings").elements.api_key.value = $("key-input").value;
    $("settings").dispatchEvent(new Event("input"));
    watchServer();
  });
  let stopSlots = null;
  togglePanel($("toggle-settings"), $("settings-panel"));
  togglePanel($("toggle-server"), $("server-panel"), {
    onShow: () => (stopSlots = watchSlots($("slots").tBodies[0], () => !$("server-panel").hidden, (e) => notice(`Slots: ${e.message}`))),
    onHide: () => stopSlots?.(),
  });
}

function boot() {
  state.settings = bindSettings($("settings"), (settings) => setApiKey(settings.api_key));
  setApiKey(state.settings.api_key);
  state.conversation = store.getConversation(store.currentId()) || store.newConversation();
  wire();
  render();
  watchServer();
  $("input").focus();
}

boot();
