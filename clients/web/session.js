// A session's life on the page: where it is opened (the page's worker, or the one the
// router places it on), on which transport (WebRTC, falling back to the WebSocket), and how
// it is taken up again after a dropped connection, a refusal or a migration.

import { OfferError } from "./errors.js";
import { onMessage } from "./messages.js";
import { banner, capacityBanner, resumeNotice } from "./overlay.js";
import { $, apiKey, link, num, params, setApiKey, state } from "./page.js";
import { RtcTransport } from "./rtc.js";
import { WsTransport } from "./ws.js";

const FIRST_FRAME_TIMEOUT_MS = 8000;
const MAX_BACKOFF_MS = 8000;

let backoff = 500;

// The server that served the page says whether it is a worker or a router.
export async function detectMode() {
  try {
    const resp = await fetch("/web/config", { cache: "no-store" });
    const config = resp.ok ? await resp.json() : {};
    if (config.mode === "router") link.routerBase = location.origin;
  } catch {
    // an older worker without /web/config: open sessions right here
  }
  state.mode = link.routerBase ? "router" : "worker";
}

// bucket 0: the worker's smallest, asked once the worker is known (after a placement).
export function startRequest() {
  const start = {
    prompt: params.get("prompt") || $("prompt").value || "a green forest",
    seed: num("seed", 0),
    bucket: num("bucket", 0),
    lookahead: num("lookahead", 1),
  };
  // ?fps= asks for a rate; without it the server paces the session at its model's own (started says which)
  if (params.has("fps")) start.fps = num("fps", 24);
  if (apiKey) start.api_key = apiKey;
  return { start };
}

async function defaultBucket(base) {
  try {
    const load = await (await fetch(`${base}/v1/load`)).json();
    return Math.min(...load.buckets) || 64;
  } catch {
    return 64;
  }
}

// A worker's http base from its WebSocket URL (a migrate's url): ws://h:p/v1/ws -> http://h:p.
function httpBase(wsUrl) {
  return wsUrl.replace(/^ws/, "http").replace(/\/v1\/ws\/?$/, "");
}

// Router mode: ask the router where the session goes and point link.serverBase there. A start
// gets a placement (a worker and a reservation, sent as the start's session_id); a resume
// gets the worker that holds the session or will restore it. Router errors (503 with
// retry_after when no worker has room, 404 when the session is gone) are thrown as
// OfferErrors, which handleOpenError treats like a worker's.
async function routed(request) {
  const place = Boolean(request.start);
  const headers = { "Content-Type": "application/json" };
  if (place && apiKey) headers.Authorization = `Bearer ${apiKey}`;
  const resp = await fetch(`${link.routerBase}${place ? "/v1/place" : "/v1/resume"}`, {
    method: "POST",
    headers,
    body: JSON.stringify(place ? {} : { session_id: request.resume.session_id }),
  });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new OfferError(resp.status, data);
  link.serverBase = (data.address || httpBase(data.url)).replace(/\/+$/, "");
  return place ? { start: { ...request.start, session_id: data.session_id } } : request;
}

let rtcFailed = false; // once WebRTC failed here, stay on the WebSocket

function transports() {
  const t = params.get("transport") || "auto";
  const rtc = typeof window.RTCPeerConnection === "function";
  if (t === "ws" || !rtc || rtcFailed) return [WsTransport];
  if (t === "webrtc") return [RtcTransport];
  return [RtcTransport, WsTransport];
}

// Errors about the session itself (capacity, auth, token, state) are the same on every
// transport; anything else (WebRTC disabled, no connection, no picture) tries the next.
function fallsBack(err) {
  if (!(err instanceof OfferError)) return true;
  const busy = err.body.error === "at_capacity" || err.body.error === "not_ready";
  return err.body.error === "rtc_disabled" || (err.status >= 500 && !busy);
}

async function open(request) {
  const kinds = transports();
  for (const [i, Kind] of kinds.entries()) {
    const t = new Kind();
    try {
      return { t, session: await t.open(request) };
    } catch (err) {
      t.close();
      if (!fallsBack(err) || i === kinds.length - 1) throw err;
      state.fallbackReason = `${t.name}: ${err.message}`;
      console.warn(`${t.name} failed, falling back:`, err);
      if (Kind === RtcTransport) rtcFailed = true;
      if (t.session) {
        // The offer opened the session but no media flowed: take it over on the next
        // transport (block 0 of the same session: nothing was shown yet).
        state.session = { id: t.session.session_id, token: t.session.token };
        state.lastBlock = -1;
        request = { resume: { session_id: t.session.session_id, token: t.session.token } };
      }
    }
  }
  throw new Error("no transport");
}

// located: link.serverBase already names the worker to use (a migrate's target); otherwise, in
// router mode, the router is asked first (every start and every other resume).
export async function connect(request, located = false) {
  try {
    let sent = request;
    if (link.routerBase && !located) sent = await routed(request);
    state.server = link.serverBase;
    if (sent.start && !sent.start.bucket) {
      // Resolved once: retries (and re-placements) keep the same bucket.
      request.start.bucket = await defaultBucket(link.serverBase);
      sent = { start: { ...sent.start, bucket: request.start.bucket } };
    }
    const { t, session } = await open(sent);
    link.conn = t;
    state.transport = t.name;
    onMessage(session);
    backoff = 500;
    banner("");
    resumeNotice(session);
    t.onDown = (reason) => reconnect(reason);
    if (t.name === "webrtc") expectFrames(t);
  } catch (err) {
    handleOpenError(err, request);
  }
}

// The key form: shown when the server wants a key; a key typed there is kept (page.js) and
// the session is asked for again with it (a new start: the refused one carried none).
function askForKey(request) {
  const form = $("key-form");
  setApiKey(null); // a stored key the server refused is of no use
  form.hidden = false;
  $("api-key").focus();
  form.onsubmit = (e) => {
    e.preventDefault();
    const key = $("api-key").value.trim();
    if (!key) return;
    setApiKey(key);
    $("api-key").value = "";
    form.hidden = true;
    connect(request.start ? startRequest() : request);
  };
}

function handleOpenError(err, request) {
  const body = err instanceof OfferError ? err.body : { message: String(err.message || err) };
  if (body.error === "at_capacity" || body.error === "not_ready" || body.error === "no_worker_available") {
    capacityBanner(body.retry_after);
    setTimeout(() => connect(request), Math.max(1, body.retry_after || 5) * 1000);
    return;
  }
  if (body.error === "missing_session_state" && request.resume) {
    banner("The session expired; starting a new one.", "info", 3000);
    state.session = null;
    connect(startRequest());
    return;
  }
  if (link.routerBase && (body.error === "placement_required" || body.error === "session_moved")) {
    // The reservation lapsed or was taken, or the session moved on: ask the router again.
    setTimeout(() => connect(request), backoff);
    backoff = Math.min(MAX_BACKOFF_MS, backoff * 2);
    return;
  }
  if (body.error === "unauthorized") {
    banner("This server needs an API key: enter it below.", "error");
    askForKey(request);
    return;
  }
  const refused = err.status >= 400 && err.status < 500 && body.error;
  if (body.error === "bad_token" || refused) {
    banner(`Cannot open a session: ${body.message}`, "error");
    return;
  }
  banner(`Cannot connect (${body.message}). Retrying…`, "error");
  setTimeout(() => connect(request), backoff);
  backoff = Math.min(MAX_BACKOFF_MS, backoff * 2);
}

// WebRTC connected but no picture: switch to the WebSocket, taking the session over.
function expectFrames(t) {
  const shownAtStart = state.framesShown;
  setTimeout(() => {
    if (link.conn !== t || t.closed || state.framesShown !== shownAtStart) return;
    if (params.get("transport") === "webrtc") {
      banner("WebRTC connected but no video arrives.", "error");
      return;
    }
    state.fallbackReason = "webrtc: no video frames";
    rtcFailed = true;
    t.closed = true;
    t.pc.close();
    state.lastBlock = -1;
    connect({ resume: { session_id: state.session.id, token: state.session.token } });
  }, FIRST_FRAME_TIMEOUT_MS);
}

function reconnect(reason) {
  if (state.ended || !state.session) return;
  state.reconnects += 1;
  const request = { resume: { session_id: state.session.id, token: state.session.token } };
  const m = state.migrate;
  state.migrate = null;
  if (m) {
    // Resume on the target worker at the block it generates next. No target yet (url
    // ""): after retry_after, ask the router (router mode) or try the same worker again.
    request.resume.block_idx = m.block_idx;
    if (m.url) {
      link.serverBase = httpBase(m.url);
      setTimeout(() => connect(request, true), 0);
    } else {
      setTimeout(() => connect(request), Math.max(1, m.retry_after || 1) * 1000);
    }
    return;
  }
  banner(`Connection lost (${reason}); reconnecting…`, "error");
  setTimeout(() => connect(request), backoff);
  backoff = Math.min(MAX_BACKOFF_MS, backoff * 2);
}
