// Conversations and settings, kept in this browser's localStorage (they survive a reload).

const CONVERSATIONS = "mlxcel.webui.conversations";
const CURRENT = "mlxcel.webui.current";
const SETTINGS = "mlxcel.webui.settings";
export const SETTING_NAMES = ["system", "temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "api_key"];
const TITLE_CHARS = 48;

function read(key, fallback) {
  try {
    const raw = localStorage.getItem(key);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;
  }
}

const write = (key, value) => localStorage.setItem(key, JSON.stringify(value));
const newId = () => `c-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;

/** A conversation: { id, title, created, updated, messages: [{ role, content, stats?, stopped? }] }. */
export function newConversation() {
  const now = Date.now();
  return { id: newId(), title: "New conversation", created: now, updated: now, messages: [] };
}

/** Every stored conversation, newest first. */
export function listConversations() {
  const all = read(CONVERSATIONS, []);
  return Array.isArray(all) ? all.sort((a, b) => b.updated - a.updated) : [];
}

export function getConversation(id) {
  return listConversations().find((c) => c.id === id) || null;
}

/** Store `conversation` (its title taken from the first user turn until renamed). */
export function saveConversation(conversation) {
  const first = conversation.messages.find((m) => m.role === "user");
  if (!conversation.renamed && first) conversation.title = first.content.trim().slice(0, TITLE_CHARS) || "Untitled";
  conversation.updated = Date.now();
  const others = listConversations().filter((c) => c.id !== conversation.id);
  write(CONVERSATIONS, [conversation, ...others]);
  write(CURRENT, conversation.id);
}

export function renameConversation(id, title) {
  const conversation = getConversation(id);
  if (!conversation || !title.trim()) return;
  conversation.title = title.trim();
  conversation.renamed = true;
  saveConversation(conversation);
}

export function deleteConversation(id) {
  write(CONVERSATIONS, listConversations().filter((c) => c.id !== id));
}

export const currentId = () => read(CURRENT, null);
export const setCurrentId = (id) => write(CURRENT, id);

/** Every conversation as one JSON document (what Import reads back). */
export function exportJSON() {
  return JSON.stringify({ format: "mlxcel-webui-conversations", version: 1, conversations: listConversations() }, null, 2);
}

function validMessage(m) {
  return m && ["user", "assistant", "system"].includes(m.role) && typeof m.content === "string";
}

/** Add the conversations of an exported document; returns how many. Throws on a document that is not one. */
export function importJSON(text) {
  const doc = JSON.parse(text);
  const incoming = Array.isArray(doc) ? doc : doc.conversations;
  if (!Array.isArray(incoming)) throw new Error("not an exported conversations file");
  const all = listConversations();
  const ids = new Set(all.map((c) => c.id));
  let added = 0;
  for (const c of incoming) {
    if (!c || !Array.isArray(c.messages) || !c.messages.every(validMessage)) continue;
    const id = typeof c.id === "string" && !ids.has(c.id) ? c.id : newId();
    ids.add(id);
    all.push({ ...newConversation(), ...c, id, title: String(c.title || "Imported"), renamed: true });
    added += 1;
  }
  write(CONVERSATIONS, all);
  return added;
}

/** The stored settings (strings as typed; empty = the server's default). */
export function loadSettings() {
  const saved = read(SETTINGS, {});
  return Object.fromEntries(SETTING_NAMES.map((name) => [name, typeof saved[name] === "string" ? saved[name] : ""]));
}

export const saveSettings = (settings) => write(SETTINGS, settings);
