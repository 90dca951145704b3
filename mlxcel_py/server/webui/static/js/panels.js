// The settings panel (persisted in the browser) and the server panel (model, context, live /slots).
import { getJSON } from "/webui/js/api.js";
import { SETTING_NAMES, loadSettings, saveSettings } from "/webui/js/store.js";

const SLOTS_EVERY_MS = 1000;
// Server defaults shown as placeholders: /props' default_generation_settings.params names.
const DEFAULT_OF = { temperature: "temperature", top_p: "top_p", top_k: "top_k", min_p: "min_p", seed: "seed" };

/** Wire a toggle button to its panel; onShow/onHide run as it opens and closes. */
export function togglePanel(buttonEl, panel, { onShow, onHide } = {}) {
  buttonEl.addEventListener("click", () => {
    const show = panel.hidden;
    panel.hidden = !show;
    buttonEl.setAttribute("aria-expanded", String(show));
    (show ? onShow : onHide)?.();
  });
}

/** Fill the settings form and save every change; onChange(settings) after each. */
export function bindSettings(form, onChange) {
  const settings = loadSettings();
  for (const name of SETTING_NAMES) form.elements[name].value = settings[name];
  form.addEventListener("input", () => {
    for (const name of SETTING_NAMES) settings[name] = form.elements[name].value;
    saveSettings(settings);
    onChange(settings);
  });
  form.addEventListener("submit", (event) => event.preventDefault());
  return settings;
}

/** Show the server's sampling defaults as the placeholders of empty fields. */
export function showDefaults(form, props) {
  const params = props?.default_generation_settings?.params || {};
  for (const [field, key] of Object.entries(DEFAULT_OF)) {
    if (params[key] !== undefined) form.elements[field].placeholder = String(params[key]);
  }
  form.elements.max_tokens.placeholder = "until the context is full";
}

function row(term, value) {
  const dt = document.createElement("dt");
  dt.textContent = term;
  const dd = document.createElement("dd");
  dd.textContent = value;
  return [dt, dd];
}

/** The server panel's facts from /v1/models and /props. */
export function showServerInfo(list, models, props) {
  const model = models?.data?.[0] || {};
  const meta = model.meta || {};
  list.replaceChildren(
    ...row("Model", model.id ?? "?"),
    ...row("Slots", String(props?.total_slots ?? meta.slots ?? "?")),
    ...row("Context per slot", `${meta.slot_context ?? props?.default_generation_settings?.n_ctx ?? "?"} tokens`),
    ...row("Model context", `${meta.context_length ?? "?"} tokens`),
    ...row("Weights", props?.model_path ?? "?"),
    ...row("Build", props?.build_info ?? "?"),
  );
}

function slotRow(slot) {
  const tr = document.createElement("tr");
  tr.dataset.state = slot.state;
  let progress = "";
  if (slot.state === "prefill" && slot.prompt_tokens) {
    progress = `${slot.processed} / ${slot.prompt_tokens} (${Math.floor((100 * slot.processed) / slot.prompt_tokens)}%)`;
  } else if (slot.state === "decode") {
    progress = `prompt ${slot.prompt_tokens}`;
  }
  const state = { idle: "idle", prefill: "prefilling", decode: "decoding" }[slot.state] || slot.state;
  for (const cell of [slot.id, state, progress, slot.generated, slot.n_ctx]) {
    const td = document.createElement("td");
    td.textContent = String(cell ?? "");
    tr.append(td);
  }
  return tr;
}

/** Poll /slots into `tbody` while `isVisible()`; returns a stop function. */
export function watchSlots(tbody, isVisible, onError) {
  let timer = null;
  const tick = async () => {
    if (isVisible() && document.visibilityState === "visible") {
      try {
        tbody.replaceChildren(...(await getJSON("/slots")).map(slotRow));
      } catch (error) {
        onError(error);
      }
    }
    timer = setTimeout(tick, SLOTS_EVERY_MS);
  };
  tick();
  return () => clearTimeout(timer);
}
