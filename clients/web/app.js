// The worldserve browser client: WebRTC video + data channels, or WebSocket + JPEG.
//
// Query parameters: transport=auto|webrtc|ws (auto: WebRTC, falling back to the
// WebSocket when it is unavailable, disabled or does not connect), prompt, seed, fps,
// bucket (default: the server's smallest), lookahead, api_key (when the server needs one).
//
// Both transports speak protocol v1 (protocol/codec.py) in msgpack. On WebRTC the
// offer (POST /v1/rtc/offer) opens or resumes the session; 'actions' (unordered, no
// retransmits) carries action messages and 'control' everything else. On the WebSocket
// every message goes over the socket and frames arrive as JPEG 'frame' messages.
//
// Two modes, from GET /web/config of the server that served the page: "worker" (one
// worker, no router): sessions open at the page's origin. "router" (several workers
// behind `worldserve router`, which served the page): a new session is placed with the
// router's POST /v1/place and opened at the worker it names (cross-origin), with the
// reservation as the start's session_id; after a dropped connection, or a 'migrate' with
// no target, POST /v1/resume says which worker to resume on. A 'migrate' with a url is
// followed straight to that worker in both modes.
//
// window.worldserve exposes the live state (tests and debugging read it).

import { encode, decode } from "./msgpack.js";

const V = 1;
const KEYMAP = {
  KeyW: "forward", ArrowUp: "forward",
  KeyS: "back", ArrowDown: "back",
  KeyA: "left", ArrowLeft: "left",
  KeyD: "right", ArrowRight: "right",
};
const MOUSE_PIXELS = 24; // pointer movement per action tick that means full deflection
const MOUSE_HZ = 30;
const CONNECT_TIMEOUT_MS = 10000;
const FIRST_FRAME_TIMEOUT_MS = 8000;
const MAX_BACKOFF_MS = 8000;

const $ = (id) => document.getElementById(id);
const video = $("video");
const canvas = $("canvas");
const stage = $("stage");

const params = new URLSearchParams(location.search);
const apiKey = params.get("api_key"); // when the server requires one
const num = (name, dflt) => {
  const v = Number(params.get(name));
  return params.has(name) && Number.isFinite(v) ? v : dflt;
};

const state = {
  transport: null, // "webrtc" | "ws"
  codec: null,
  session: null, // { id, token }
  width: 0,
  height: 0,
  level: 0,
  fps: 0, // the frame rate the session is paced at: started (as admitted), then degradations
  controls: null, // what the model takes (started.controls): keys, mouse, prompt, observation
  skippedFrames: 0, // display frames that kept the last picture because a block came late
  ended: null,
  framesShown: 0,
  frameTimes: [], // performance.now() of recent shown frames
  latencies: [], // ms, recent action-to-frame
  seq: 0,
  pending: new Map(), // action seq -> performance.now() when sent
  awaitingFrame: null, // (RTC) send time of an action the next shown frame reflects
  lastBlock: -1, // (WS) newest block shown, for resume
  promptId: 0,
  reconnects: 0,
  fallbackReason: null,
  migrate: null, // a 'migrate' message to follow when the connection closes
  lastError: null,
  mode: null, // "worker" | "router" (GET /web/config)
  server: location.origin, // the worker the session is on (or is being opened on)
};
window.worldserve = state;

let conn = null; // the live transport
let serverBase = location.origin; // the worker's http base: where sessions are opened (a migrate moves it)
let routerBase = null; // router mode: the router that served the page
let keys = new Set();
let mouse = { dx: 0, dy: 0, active: false };
let backoff = 500;

// ---------------------------------------------------------------- UI

function banner(text, kind = "info", ms = 0) {
  const el = $("banner");
  el.textContent = text;
  el.className = kind;
  el.hidden = !text;
  clearTimeout(banner.timer);
  if (text && ms) banner.timer = setTimeout(() => { el.hidden = true; }, ms);
}

// A session restored after a worker crash is off by `gap_blocks` blocks (docs/protocol.md,
// `resumed`): say so, briefly. 0 (a plain resume, a drain) says nothing.
function resumeNotice(msg) {
  const gap = msg.type === "resumed" && typeof msg.gap_blocks === "number" ? msg.gap_blocks : 0;
  if (gap > 0) {
    banner(`Resumed after a server restart: ${gap} block${gap === 1 ? " was" : "s were"} lost`,
      "info", 8000);
  }
}

function renderStats() {
  const now = performance.now();
  while (state.frameTimes.length && now - state.frameTimes[0] > 1000) state.frameTimes.shift();
  $("stat-fps").textContent = state.framesShown ? String(state.frameTimes.length) : "–";
  const lat = state.latencies.slice(-15).sort((a, b) => a - b);
  $("stat-latency").textContent = lat.length ? `${Math.round(lat[lat.length >> 1])} ms` : "–";
  $("stat-level").textContent = state.session ? String(state.level) : "–";
  $("stat-size").textContent = state.width ? `${state.width}×${state.height}` : "–";
  const via = state.transport === "webrtc" ? `WebRTC ${state.codec || ""}` : state.transport === "ws" ? "WebSocket JPEG" : "–";
  $("stat-transport").textContent = via.trim();
  $("stat-session").textContent = state.session ? state.session.id : "–";
  $("stat-controls").textContent = state.controls ? state.controls.join(", ") || "none" : "–";
}
setInterval(renderStats, 250);

function frameShown(when) {
  state.framesShown += 1;
  state.frameTimes.push(when);
}

function recordLatency(ms) {
  if (ms >= 0 && ms < 10000) {
    state.latencies.push(ms);
    if (state.latencies.length > 100) state.latencies.shift();
  }
}

// The newest pending action with seq <= appliedSeq: its send time (older ones dropped).
function takeApplied(appliedSeq) {
  let best = null;
  let bestSeq = -1;
  for (const [seq, t] of state.pending) {
    if (seq <= appliedSeq) {
      if (seq > bestSeq) { best = t; bestSeq = seq; }
      state.pending.delete(seq);
    }
  }
  return best;
}

// ---------------------------------------------------------------- messages (both transports)

function onMessage(msg) {
  switch (msg.type) {
    case "started":
    case "resumed":
      state.session = { id: msg.session_id, token: msg.token || (state.session && state.session.token) };
      state.level = msg.level;
      state.fps = msg.fps;
      state.width = msg.width;
      state.height = msg.height;
      state.ended = null;
      if (Array.isArray(msg.controls)) {
        state.controls = msg.controls;
        $("prompt-form").hidden = !msg.controls.includes("prompt"); // a model steered without text
      }
      break;
    case "status":
      state.level = msg.level;
      if (typeof msg.action_seq === "number" && msg.action_seq > 0) {
        const t = takeApplied(msg.action_seq);
        if (t !== null) state.awaitingFrame = t;
      }
      break;
    case "degradation":
      state.level = msg.new_level;
      state.fps = msg.fps;
      banner(msg.new_level > msg.old_level
        ? `Server busy: quality lowered (${msg.changes.join(", ")})`
        : `Quality restored (${msg.changes.join(", ")})`, "info", 4000);
      break;
    case "ack":
      if (msg.of === "prompt") banner("Scene updated", "info", 1500);
      break;
    case "error":
      state.lastError = msg;
      if (msg.code === "at_capacity" || msg.code === "not_ready") {
        capacityBanner(msg.retry_after);
      } else {
        banner(`Error: ${msg.message}`, "error", msg.fatal ? 0 : 5000);
      }
      break;
    case "migrate":
      // The worker is draining: the session continues on another one (msg.url, "" when
      // none is free yet). Followed when this connection closes (right after 'ended').
      state.migrate = msg;
      banner("The server is handing this session over; reconnecting…", "info");
      break;
    case "ended":
      if (msg.reason === "migrated" && state.migrate) break;
      state.ended = msg.reason;
      banner(msg.reason === "replaced"
        ? "This session was opened elsewhere."
        : `Session ended (${msg.reason}). Reload to start a new one.`, "error");
      break;
    case "skipped":
      // Block msg.block_idx came late and is the next frame; the picture on screen stayed
      // for msg.frames display frames. Blocks are never skipped: nothing to redraw or count
      // twice (the resume point still follows the frames received).
      state.skippedFrames += msg.frames;
      break;
    case "frame":
      drawJpeg(msg);
      break;
    default:
      break;
  }
}

function capacityBanner(retryAfter) {
  const s = Math.max(1, Math.ceil(retryAfter || 5));
  banner(`The server is at capacity. Retrying in ${s} s…`, "error");
}

// ---------------------------------------------------------------- WebRTC

class OfferError extends Error {
  constructor(status, body) {
    super(body.message || `offer failed (${status})`);
    this.status = status;
    this.body = body;
  }
}

class RtcTransport {
  constructor() {
    this.name = "webrtc";
    this.pc = null;
    this.control = null;
    this.actions = null;
    this.closed = false;
    this.onDown = null;
    this.session = null; // set once the offer is answered
  }

  async open(request) {
    const pc = new RTCPeerConnection({ iceServers: [] });
    this.pc = pc;
    pc.addTransceiver("video", { direction: "recvonly" });
    this.control = pc.createDataChannel("control");
    this.control.binaryType = "arraybuffer";
    this.actions = pc.createDataChannel("actions", { ordered: false, maxRetransmits: 0 });
    this.control.onmessage = (e) => onMessage(decode(e.data));
    pc.ontrack = (e) => {
      video.srcObject = new MediaStream([e.track]);
      video.play().catch(() => {});
    };
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc, 3000);
    const resp = await fetch(`${serverBase}/v1/rtc/offer`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ type: "offer", sdp: pc.localDescription.sdp, ...request }),
    });
    const data = await resp.json().catch(() => ({}));
    if (!resp.ok) {
      pc.close();
      throw new OfferError(resp.status, data);
    }
    this.session = data.session;
    await pc.setRemoteDescription({ type: data.type, sdp: data.sdp });
    state.codec = data.codec;
    await waitConnected(pc, CONNECT_TIMEOUT_MS);
    let lost = null;
    pc.onconnectionstatechange = () => {
      const s = pc.connectionState;
      if (s === "failed") this.down("connection failed");
      else if (s === "disconnected") lost = setTimeout(() => this.down("connection lost"), 3000);
      else if (s === "connected") clearTimeout(lost);
    };
    this.control.onclose = () => this.down("control channel closed");
    watchVideo();
    return data.session;
  }

  down(reason) {
    if (this.closed) return;
    this.close();
    if (this.onDown) this.onDown(reason);
  }

  sendControl(msg) {
    if (this.control && this.control.readyState === "open") this.control.send(encode(msg));
  }

  sendAction(msg) {
    if (this.actions && this.actions.readyState === "open") this.actions.send(encode(msg));
  }

  close() {
    this.closed = true;
    if (this.pc) this.pc.close();
  }
}

function iceGatheringComplete(pc, ms) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      if (pc.iceGatheringState === "complete") {
        pc.removeEventListener("icegatheringstatechange", done);
        resolve();
      }
    };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, ms); // send what we have
  });
}

function waitConnected(pc, ms) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("WebRTC did not connect")), ms);
    const check = () => {
      if (pc.connectionState === "connected") { clearTimeout(timer); resolve(); }
      else if (pc.connectionState === "failed" || pc.connectionState === "closed") {
        clearTimeout(timer);
        reject(new Error(`WebRTC ${pc.connectionState}`));
      }
    };
    pc.addEventListener("connectionstatechange", check);
    check();
  });
}

// Count presented video frames; an action's latency ends at the first frame presented
// after the server said that frame carries it.
let watching = false;
function watchVideo() {
  video.hidden = false;
  canvas.hidden = true;
  if (watching) return;
  watching = true;
  if ("requestVideoFrameCallback" in HTMLVideoElement.prototype) {
    const onFrame = (now, meta) => {
      frameShown(now);
      state.width = meta.width;
      state.height = meta.height;
      if (state.awaitingFrame !== null) {
        recordLatency(now - state.awaitingFrame);
        state.awaitingFrame = null;
      }
      video.requestVideoFrameCallback(onFrame);
    };
    video.requestVideoFrameCallback(onFrame);
  } else {
    let last = 0;
    setInterval(() => {
      const q = video.getVideoPlaybackQuality();
      for (; last < q.totalVideoFrames; last++) frameShown(performance.now());
      if (state.awaitingFrame !== null && q.totalVideoFrames > last - 1) {
        recordLatency(performance.now() - state.awaitingFrame);
        state.awaitingFrame = null;
      }
    }, 20);
  }
}

// ---------------------------------------------------------------- WebSocket + JPEG

class WsTransport {
  constructor() {
    this.name = "ws";
    this.ws = null;
    this.closed = false;
    this.onDown = null;
  }

  open(request) {
    const url = `${serverBase.replace(/^http/, "ws")}/v1/ws`; // http -> ws, https -> wss
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url);
      this.ws = ws;
      ws.binaryType = "arraybuffer";
      let opened = false;
      let lastError = null;
      ws.onopen = () => {
        if (request.start) {
          ws.send(encode({ type: "start", v: V, codec: "jpeg", mode: "push", ...request.start }));
        } else {
          const r = request.resume;
          const blockIdx = r.block_idx ?? Math.max(0, state.lastBlock + 1);
          ws.send(encode({ type: "resume", v: V, session_id: r.session_id, token: r.token,
                           block_idx: blockIdx }));
        }
      };
      ws.onmessage = (e) => {
        const msg = decode(e.data);
        if (msg.type === "error") lastError = msg;
        if (!opened && (msg.type === "started" || msg.type === "resumed")) {
          opened = true;
          canvas.hidden = false;
          video.hidden = true;
          resolve(msg);
        }
        if (opened || msg.type !== "error") onMessage(msg);
      };
      ws.onclose = (e) => {
        if (!opened) {
          const body = lastError || { error: "closed", message: `WebSocket closed (${e.code})` };
          reject(new OfferError(e.code === 1013 ? 503 : 400,
            { error: body.code || body.error, message: body.message, retry_after: body.retry_after }));
        } else if (!this.closed) {
          this.closed = true;
          if (this.onDown) this.onDown(`WebSocket closed (${e.code})`);
        }
      };
    });
  }

  sendControl(msg) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(encode(msg));
  }

  sendAction(msg) { this.sendControl(msg); }

  close() {
    this.closed = true;
    if (this.ws) this.ws.close(1000);
  }
}

const ctx = canvas.getContext("2d");
let decoding = false;
let nextFrame = null;

function drawJpeg(msg) {
  nextFrame = msg; // latest wins: a frame that arrives while one decodes replaces the waiting one
  if (!decoding) decodeNext();
}

async function decodeNext() {
  decoding = true;
  while (nextFrame) {
    const msg = nextFrame;
    nextFrame = null;
    try {
      const bmp = await createImageBitmap(new Blob([msg.data], { type: "image/jpeg" }));
      if (canvas.width !== bmp.width || canvas.height !== bmp.height) {
        canvas.width = bmp.width;
        canvas.height = bmp.height;
      }
      ctx.drawImage(bmp, 0, 0);
      bmp.close();
      const now = performance.now();
      frameShown(now);
      state.width = msg.width;
      state.height = msg.height;
      state.lastBlock = Math.max(state.lastBlock, msg.block_idx);
      if (msg.action_seq > 0) {
        const t = takeApplied(msg.action_seq);
        if (t !== null) recordLatency(now - t);
      }
    } catch (err) {
      console.warn("frame decode failed", err);
    }
  }
  decoding = false;
}

// ---------------------------------------------------------------- session lifecycle

// The server that served the page says whether it is a worker or a router.
async function detectMode() {
  try {
    const resp = await fetch("/web/config", { cache: "no-store" });
    const config = resp.ok ? await resp.json() : {};
    if (config.mode === "router") routerBase = location.origin;
  } catch {
    // an older worker without /web/config: open sessions right here
  }
  state.mode = routerBase ? "router" : "worker";
}

// bucket 0: the worker's smallest, asked once the worker is known (after a placement).
function startRequest() {
  const start = {
    prompt: params.get("prompt") || $("prompt").value || "a green forest",
    seed: num("seed", 0),
    fps: num("fps", 24),
    bucket: num("bucket", 0),
    lookahead: num("lookahead", 1),
  };
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

// Router mode: ask the router where the session goes and point serverBase there. A start
// gets a placement (a worker and a reservation, sent as the start's session_id); a resume
// gets the worker that holds the session or will restore it. Router errors (503 with
// retry_after when no worker has room, 404 when the session is gone) are thrown as
// OfferErrors, which handleOpenError treats like a worker's.
async function routed(request) {
  const place = Boolean(request.start);
  const headers = { "Content-Type": "application/json" };
  if (place && apiKey) headers.Authorization = `Bearer ${apiKey}`;
  const resp = await fetch(`${routerBase}${place ? "/v1/place" : "/v1/resume"}`, {
    method: "POST",
    headers,
    body: JSON.stringify(place ? {} : { session_id: request.resume.session_id }),
  });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new OfferError(resp.status, data);
  serverBase = (data.address || httpBase(data.url)).replace(/\/+$/, "");
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
  return err.body.error === "rtc_disabled" || (err.status >= 500 && err.body.error !== "at_capacity" && err.body.error !== "not_ready");
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

// located: serverBase already names the worker to use (a migrate's target); otherwise, in
// router mode, the router is asked first (every start and every other resume).
async function connect(request, located = false) {
  try {
    let sent = request;
    if (routerBase && !located) sent = await routed(request);
    state.server = serverBase;
    if (sent.start && !sent.start.bucket) {
      // Resolved once: retries (and re-placements) keep the same bucket.
      request.start.bucket = await defaultBucket(serverBase);
      sent = { start: { ...sent.start, bucket: request.start.bucket } };
    }
    const { t, session } = await open(sent);
    conn = t;
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
  if (routerBase && (body.error === "placement_required" || body.error === "session_moved")) {
    // The reservation lapsed or was taken, or the session moved on: ask the router again.
    setTimeout(() => connect(request), backoff);
    backoff = Math.min(MAX_BACKOFF_MS, backoff * 2);
    return;
  }
  if (body.error === "bad_token" || body.error === "unauthorized" || (err.status >= 400 && err.status < 500 && body.error)) {
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
    if (conn !== t || t.closed || state.framesShown !== shownAtStart) return;
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
      serverBase = httpBase(m.url);
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

// ---------------------------------------------------------------- input

function sendAction() {
  if (!conn || state.ended) return;
  const clip = (x) => Math.max(-1, Math.min(1, x));
  const m = [clip(mouse.dx / MOUSE_PIXELS), clip(mouse.dy / MOUSE_PIXELS)];
  mouse.dx = 0;
  mouse.dy = 0;
  state.seq += 1;
  state.pending.set(state.seq, performance.now());
  if (state.pending.size > 64) state.pending.delete(state.pending.keys().next().value);
  conn.sendAction({ type: "action", v: V, seq: state.seq, keys: [...keys], mouse: m });
}

function typing(e) {
  return e.target instanceof HTMLInputElement || e.target instanceof HTMLTextAreaElement;
}

window.addEventListener("keydown", (e) => {
  const key = KEYMAP[e.code];
  if (!key || typing(e) || e.metaKey || e.ctrlKey || e.altKey) return;
  e.preventDefault();
  if (!keys.has(key)) {
    keys.add(key);
    sendAction();
  }
});

window.addEventListener("keyup", (e) => {
  const key = KEYMAP[e.code];
  if (key && keys.delete(key)) sendAction();
});

window.addEventListener("blur", () => {
  if (keys.size) {
    keys = new Set();
    sendAction();
  }
});

stage.addEventListener("click", () => {
  stage.focus();
  if (document.pointerLockElement !== stage && stage.requestPointerLock) stage.requestPointerLock();
});

document.addEventListener("mousemove", (e) => {
  if (document.pointerLockElement === stage) {
    mouse.dx += e.movementX;
    mouse.dy += e.movementY;
  }
});

setInterval(() => {
  const moved = mouse.dx !== 0 || mouse.dy !== 0;
  if (moved || mouse.active) {
    mouse.active = moved; // one more action with a zero delta after the pointer stops
    sendAction();
  }
}, 1000 / MOUSE_HZ);

$("prompt-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || !conn) return;
  state.promptId += 1;
  conn.sendControl({ type: "prompt", v: V, prompt: text, id: state.promptId });
  stage.focus();
});

window.addEventListener("pagehide", () => {
  // Leaving the page ends the session (a dropped connection only detaches it): 'close'
  // on the connection, and a DELETE (to the worker holding the session) that outlives
  // the page in case that is cut off.
  if (conn) {
    conn.sendControl({ type: "close", v: V, reason: "page closed" });
    conn.close();
  }
  if (state.session && !state.ended) {
    const headers = apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
    fetch(`${serverBase}/v1/sessions/${encodeURIComponent(state.session.id)}`,
      { method: "DELETE", keepalive: true, headers }).catch(() => {});
  }
});

// ---------------------------------------------------------------- go

$("prompt").value = params.get("prompt") || "a green forest";
detectMode().then(() => connect(startRequest()));
