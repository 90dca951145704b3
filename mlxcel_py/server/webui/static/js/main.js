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
const pending = []; // data: URLs of the images the next message sends

function notice(text) {
  $("notice").textContent = text || "";
  $("notice").hidden = !text;
}

/** A user turn as the conversation keeps it: its text, and its images when it has any. */
const userTurn = (content, images) => (images?.length ? { role: "user", content, images } : { role: "user", content });

/** A turn as the chat route takes it: its text, and its images as image_url parts after the text. */
function apiTurn({ role, content, images }) {
  if (!images?.length) return { role, content };
  return { role, content: [{ type: "text", text: content }, ...images.map((url) => ({ type: "image_url", image_url: { url } }))] };
}

/** The request body: the system prompt, the turns so far, and the sampling fields that are set. */
function requestBody(messages) {
  const s = state.settings;
  const turns = messages.filter((m) => m.content || m.images?.length).map(apiTurn);
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
  if (!text.trim() && !pending.length) return;
  $("input").value = "";
  const images = pending.splice(0);
  showPending();
  state.conversation.messages.push(userTurn(text, images));
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
  messages.splice(index, messages.length - index, userTurn(text, messages[index].images));
  store.saveConversation(state.conversation);
  generate();
}

const readDataURL = (file) => new Promise((resolve, reject) => {
  const reader = new FileReader();
  reader.onload = () => resolve(reader.result);
  reader.onerror = () => reject(reader.error);
  reader.readAsDataURL(file);
});

/** The images waiting for the next message, each with a button that drops it. */
function showPending() {
  $("attachments").replaceChildren(...pending.map((url, i) => {
    const figure = document.createElement("figure");
    const img = Object.assign(document.createElement("img"), { src: url, className: "thumb", alt: `image ${i + 1} to send` });
    const drop = Object.assign(document.createElement("button"), { type: "button", className: "small", textContent: "×" });
    drop.setAttribute("aria-label", `Remove image ${i + 1}`);
    drop.addEventListener("click", () => { pending.splice(i, 1); showPending(); });
    figure.append(img, drop);
    return figure;
  }));
  $("attachments").hidden = !pending.length;
}

async function addImages(files) {
  for (const file of files) if (file.type.startsWith("image/")) pending.push(await readDataURL(file));
  showPending();
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
    $("attach-button").hidden = !props.modalities?.vision; // only a vision-language model takes images
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
  $("attach-button").addEventListener("click", () => $("attach").click());
  $("attach").addEventListener("change", (event) => {
    addImages([...event.target.files]);
    event.target.value = "";
  });
  $("input").addEventListener("paste", (event) => {
    const files = [...(event.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/"));
    if (files.length && !$("attach-button").hidden) {
      event.preventDefault();
      addImages(files);
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
