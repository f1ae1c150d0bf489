// The banner and the stats overlay, and the figures the overlay shows: frames shown and
// action-to-frame latency.

import { $, state } from "./page.js";

export function banner(text, kind = "info", ms = 0) {
  const el = $("banner");
  el.textContent = text;
  el.className = kind;
  el.hidden = !text;
  clearTimeout(banner.timer);
  if (text && ms) banner.timer = setTimeout(() => { el.hidden = true; }, ms);
}

// A session restored after a worker crash is off by `gap_blocks` blocks (docs/protocol.md,
// `resumed`): say so, briefly. 0 (a plain resume, a drain) says nothing.
export function resumeNotice(msg) {
  const gap = msg.type === "resumed" && typeof msg.gap_blocks === "number" ? msg.gap_blocks : 0;
  if (gap > 0) {
    banner(`Resumed after a server restart: ${gap} block${gap === 1 ? " was" : "s were"} lost`,
      "info", 8000);
  }
}

export function capacityBanner(retryAfter) {
  const s = Math.max(1, Math.ceil(retryAfter || 5));
  banner(`The server is at capacity. Retrying in ${s} s…`, "error");
}

function renderStats() {
  const now = performance.now();
  while (state.frameTimes.length && now - state.frameTimes[0] > 1000) state.frameTimes.shift();
  $("stat-fps").textContent = state.framesShown ? String(state.frameTimes.length) : "–";
  const lat = state.latencies.slice(-15).sort((a, b) => a - b);
  $("stat-latency").textContent = lat.length ? `${Math.round(lat[lat.length >> 1])} ms` : "–";
  $("stat-level").textContent = state.session ? String(state.level) : "–";
  $("stat-size").textContent = state.width ? `${state.width}×${state.height}` : "–";
  const via = state.transport === "webrtc" ? `WebRTC ${state.codec || ""}`
    : state.transport === "ws" ? "WebSocket JPEG" : "–";
  $("stat-transport").textContent = via.trim();
  $("stat-session").textContent = state.session ? state.session.id : "–";
  $("stat-controls").textContent = state.controls ? state.controls.join(", ") || "none" : "–";
}

export function showStats() {
  setInterval(renderStats, 250);
}

export function frameShown(when) {
  state.framesShown += 1;
  state.frameTimes.push(when);
}

export function recordLatency(ms) {
  if (ms >= 0 && ms < 10000) {
    state.latencies.push(ms);
    if (state.latencies.length > 100) state.latencies.shift();
  }
}

// The newest pending action with seq <= appliedSeq: its send time (older ones dropped).
export function takeApplied(appliedSeq) {
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
