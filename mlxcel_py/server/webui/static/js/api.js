// Talking to this server: same origin only, the API key (when set) as a bearer token.

export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let apiKey = "";

/** Use `key` (empty: none) for every later request. */
export function setApiKey(key) {
  apiKey = key || "";
}

function headers(extra = {}) {
  return apiKey ? { ...extra, Authorization: `Bearer ${apiKey}` } : extra;
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  let code = null;
  try {
    const body = await response.json();
    const error = body.error || body;
    message = error.message || message;
    code = error.code || null;
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, message, code);
}

/** GET a JSON route; throws ApiError on a non-2xx answer. */
export async function getJSON(path) {
  const response = await fetch(path, { headers: headers(), cache: "no-store" });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

/** The server's /health status: "ok", "loading", ... */
export async function health() {
  try {
    const response = await fetch("/health", { cache: "no-store" });
    return (await response.json()).status || "error";
  } catch {
    return "unreachable";
  }
}

/** The `data:` payloads of an SSE body, as they arrive. */
async function* sseData(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data: ")) yield line.slice(6);
      }
    }
  }
}

/**
 * POST a streaming chat completion; calls onFrame(frame) for every JSON frame until [DONE].
 * Aborting `signal` ends the request (the server drops it at once).
 */
export async function streamChat(body, { signal, onFrame }) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify({ ...body, stream: true, return_progress: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!response.ok) throw await errorOf(response);
  for await (const data of sseData(response.body)) {
    if (data === "[DONE]") return;
    const frame = JSON.parse(data);
    if (frame.error) throw new ApiError(500, frame.error.message, frame.error.code);
    onFrame(frame);
  }
}
