// One conversation turn on screen: user text as text, assistant text as sanitised markdown,
// the prefill progress bar while the prompt is processed, and the reply's stats under it.
import { copyText, renderMarkdown } from "/webui/js/markdown.js";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, onClick) {
  const node = el("button", "small", label);
  node.type = "button";
  node.addEventListener("click", onClick);
  return node;
}

const seconds = (ms) => `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;

/** The stats line of a finished reply, from usage, timings and the measured TTFT. */
export function statsText(stats) {
  if (!stats) return "";
  const parts = [];
  if (stats.completion_tokens !== undefined) parts.push(`${stats.completion_tokens} tokens`);
  if (stats.tokens_per_second) parts.push(`${stats.tokens_per_second.toFixed(1)} tok/s`);
  if (stats.ttft_ms !== undefined && stats.ttft_ms !== null) parts.push(`TTFT ${seconds(stats.ttft_ms)}`);
  if (stats.prompt_tokens !== undefined) parts.push(`prompt ${stats.prompt_tokens} tokens`);
  if (stats.cached_tokens !== undefined) parts.push(`${stats.cached_tokens} cached`);
  if (stats.prompt_per_second) parts.push(`prefill ${Math.round(stats.prompt_per_second)} tok/s`);
  return parts.join(" · ");
}

/** Stats of a reply from its final frames (usage, timings) and the client's own clock. */
export function replyStats(usage, timings, ttftMs) {
  const stats = { ttft_ms: ttftMs };
  if (usage) {
    stats.completion_tokens = usage.completion_tokens;
    stats.prompt_tokens = usage.prompt_tokens;
    stats.cached_tokens = usage.prompt_tokens_details?.cached_tokens ?? 0;
  }
  if (timings) {
    stats.tokens_per_second = timings.predicted_per_second;
    stats.prompt_per_second = timings.prompt_per_second;
    if (stats.cached_tokens === undefined) stats.cached_tokens = timings.cache_n;
  }
  return stats;
}

function userBody(message) {
  const body = el("div", "body plain", message.content);
  if (!message.images?.length) return body;
  const images = el("div", "images");
  message.images.forEach((url, i) => images.append(Object.assign(el("img", "thumb"), { src: url, alt: `attached image ${i + 1}` })));
  const wrap = el("div");
  wrap.append(body, images);
  return wrap;
}

function assistantBody(message) {
  const body = el("div", "body markdown");
  body.append(renderMarkdown(message.content));
  return body;
}

/**
 * A turn's element. actions: { edit?, regenerate? } callbacks for the last user / assistant turn.
 */
export function turnElement(message, actions = {}) {
  const turn = el("article", `turn ${message.role}`);
  turn.dataset.role = message.role;
  turn.append(el("div", "who", message.role === "user" ? "You" : "Assistant"));
  turn.append(message.role === "assistant" ? assistantBody(message) : userBody(message));
  const progress = el("div", "progress");
  progress.hidden = true;
  turn.append(progress);
  const notes = [];
  if (message.stopped) notes.push("stopped");
  if (message.error) notes.push(`error: ${message.error}`);
  const stats = statsText(message.stats);
  turn.append(el("div", "stats", [stats, ...notes].filter(Boolean).join(" · ")));
  const bar = el("div", "actions");
  if (message.role === "assistant" && message.content) bar.append(button("Copy", () => copyText(message.content)));
  if (actions.regenerate) bar.append(button("Regenerate", actions.regenerate));
  if (actions.edit) bar.append(button("Edit", () => startEdit(turn, message, actions.edit)));
  turn.append(bar);
  return turn;
}

function startEdit(turn, message, onSave) {
  const area = el("textarea", "edit");
  area.value = message.content;
  area.setAttribute("aria-label", "Edit message");
  area.rows = Math.min(12, Math.max(3, message.content.split("\n").length));
  const body = turn.querySelector(".body");
  const bar = turn.querySelector(".actions");
  const editor = el("div", "editor");
  const cancel = () => {
    editor.replaceWith(body);
    bar.hidden = false;
  };
  editor.append(area, button("Save and send", () => area.value.trim() && onSave(area.value)), button("Cancel", cancel));
  area.addEventListener("keydown", (event) => {
    if (event.key === "Escape") cancel();
  });
  body.replaceWith(editor);
  bar.hidden = true;
  area.focus();
}

/** The streaming side of an assistant turn: progress while prefilling, then text as it arrives. */
export class LiveTurn {
  constructor(turn) {
    this.turn = turn;
    this.body = turn.querySelector(".body");
    this.box = turn.querySelector(".progress");
    this.text = "";
    this.pending = false;
    this.lastProcessed = 0;
    this.waiting();
  }

  waiting() {
    this.box.replaceChildren(el("span", "progress-text", "Waiting for the server…"));
    this.box.hidden = false;
    this.turn.scrollIntoView({ block: "end" });
  }

  /** A prompt_progress frame: {total, cache, processed, time_ms}. */
  progress({ total, cache, processed, time_ms: timeMs }) {
    if (!this.bar) {
      this.bar = el("div", "bar");
      this.bar.setAttribute("role", "progressbar");
      this.bar.setAttribute("aria-label", "Prompt processing");
      this.bar.setAttribute("aria-valuemin", "0");
      this.fill = el("div", "fill");
      this.bar.append(this.fill);
      this.label = el("span", "progress-text");
      this.box.replaceChildren(this.bar, this.label);
      this.lastProcessed = cache;
      this.turn.scrollIntoView({ block: "end" });
    }
    const chunk = processed - this.lastProcessed;
    this.lastProcessed = processed;
    const rate = timeMs > 0 ? (processed - cache) / timeMs : 0; // tokens per ms
    const eta = rate > 0 ? (total - processed) / rate : null;
    const percent = total ? Math.floor((100 * processed) / total) : 0;
    this.bar.setAttribute("aria-valuemax", String(total));
    this.bar.setAttribute("aria-valuenow", String(processed));
    this.bar.setAttribute("aria-valuetext", `${processed} of ${total} prompt tokens`);
    this.fill.style.width = `${percent}%`;
    const parts = [`Prompt ${processed} / ${total} tokens (${percent}%)`, `+${chunk}`];
    if (cache) parts.push(`${cache} cached`);
    if (rate > 0) parts.push(`${Math.round(rate * 1000)} tok/s`);
    if (eta !== null) parts.push(processed >= total ? "first token next" : `ETA ${seconds(eta)}`);
    this.label.textContent = parts.join(" · ");
  }

  /** More reply text: the progress goes away, the markdown is re-rendered once per frame. */
  append(delta) {
    this.box.hidden = true;
    this.text += delta;
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      const list = this.turn.parentElement;
      const atBottom = list && list.scrollHeight - list.scrollTop - list.clientHeight < 40;
      this.body.replaceChildren(renderMarkdown(this.text));
      if (atBottom) this.turn.scrollIntoView({ block: "end" });  // follow the reply unless the reader scrolled up
    });
  }
}
