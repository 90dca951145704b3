// Model output -> a sanitised DocumentFragment. The model's text is untrusted: raw HTML in it is
// shown as text, images become links (no request leaves the page), and DOMPurify checks the rest.
import { Marked } from "/webui/vendor/marked.js";
import DOMPurify from "/webui/vendor/purify.js";
import hljs from "/webui/vendor/highlight/core.js";
import bash from "/webui/vendor/highlight/languages/bash.js";
import c from "/webui/vendor/highlight/languages/c.js";
import cpp from "/webui/vendor/highlight/languages/cpp.js";
import css from "/webui/vendor/highlight/languages/css.js";
import go from "/webui/vendor/highlight/languages/go.js";
import java from "/webui/vendor/highlight/languages/java.js";
import javascript from "/webui/vendor/highlight/languages/javascript.js";
import json from "/webui/vendor/highlight/languages/json.js";
import markdown from "/webui/vendor/highlight/languages/markdown.js";
import python from "/webui/vendor/highlight/languages/python.js";
import rust from "/webui/vendor/highlight/languages/rust.js";
import shell from "/webui/vendor/highlight/languages/shell.js";
import sql from "/webui/vendor/highlight/languages/sql.js";
import typescript from "/webui/vendor/highlight/languages/typescript.js";
import xml from "/webui/vendor/highlight/languages/xml.js";
import yaml from "/webui/vendor/highlight/languages/yaml.js";

const LANGUAGES = { bash, c, cpp, css, go, java, javascript, json, markdown, python, rust, shell, sql, typescript, xml, yaml };
for (const [name, grammar] of Object.entries(LANGUAGES)) hljs.registerLanguage(name, grammar);

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export const escapeHtml = (text) => String(text).replace(/[&<>"']/g, (ch) => ESCAPES[ch]);

function highlighted(text, lang) {
  const language = (lang || "").trim().split(/\s+/)[0].toLowerCase();
  if (language && hljs.getLanguage(language)) {
    return { html: hljs.highlight(text, { language, ignoreIllegals: true }).value, language };
  }
  return { html: escapeHtml(text), language: "" };
}

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    html: ({ text }) => escapeHtml(text),
    image: ({ href, text }) => `<a href="${escapeHtml(href)}">${escapeHtml(text || href)}</a>`,
    code({ text, lang }) {
      const { html, language } = highlighted(text, lang);
      const cls = language ? ` class="hljs language-${escapeHtml(language)}"` : ` class="hljs"`;
      return `<pre><code${cls}>${html}</code></pre>\n`;
    },
  },
});

const PURIFY = { RETURN_DOM_FRAGMENT: true, FORBID_TAGS: ["img", "style", "form", "input", "button", "iframe"] };

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

function copyButton(pre) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.textContent = "Copy";
  button.addEventListener("click", async () => {
    await copyText(pre.querySelector("code")?.textContent ?? pre.textContent);
    button.textContent = "Copied";
    setTimeout(() => (button.textContent = "Copy"), 1200);
  });
  return button;
}

/** Put `text` on the clipboard (the async API where allowed, else a hidden textarea). */
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const area = document.createElement("textarea");
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
}

/** Markdown text -> a sanitised fragment with highlighted code blocks, each with a copy button. */
export function renderMarkdown(text) {
  const fragment = DOMPurify.sanitize(marked.parse(text), PURIFY);
  for (const pre of fragment.querySelectorAll("pre")) {
    const wrap = document.createElement("div");
    wrap.className = "code-block";
    pre.replaceWith(wrap);
    wrap.append(copyButton(pre), pre);
  }
  return fragment;
}
