// The list of stored conversations: open, rename (in place) and delete.
import { listConversations } from "/webui/js/store.js";

function button(label, className, onClick, ariaLabel) {
  const node = document.createElement("button");
  node.type = "button";
  node.className = className;
  node.textContent = label;
  if (ariaLabel) node.setAttribute("aria-label", ariaLabel);
  node.addEventListener("click", onClick);
  return node;
}

function startRename(li, conversation, rename, done) {
  const input = document.createElement("input");
  input.value = conversation.title;
  input.setAttribute("aria-label", "New title");
  let finished = false;
  const finish = (save) => {
    if (finished) return;
    finished = true;
    if (save) rename(conversation.id, input.value);
    done();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") finish(true);
    if (event.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(true));
  li.replaceChildren(input);
  input.focus();
  input.select();
}

/** Fill `list` with the stored conversations; `current` (which may be unsaved yet) is marked. */
export function renderSidebar(list, current, { open, rename, remove }) {
  const again = () => renderSidebar(list, current, { open, rename, remove });
  list.replaceChildren(...listConversations().map((conversation) => {
    const li = document.createElement("li");
    li.dataset.id = conversation.id;
    const title = button(conversation.title, "title", () => open(conversation.id));
    if (conversation.id === current) title.setAttribute("aria-current", "true");
    li.append(
      title,
      button("✎", "icon", () => startRename(li, conversation, rename, again), `Rename ${conversation.title}`),
      button("✕", "icon", () => remove(conversation.id), `Delete ${conversation.title}`),
    );
    return li;
  }));
}
