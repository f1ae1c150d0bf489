// The player's input: keys and the pointer become action messages (sent at most
// MOUSE_HZ times a second while the pointer moves), the form a prompt, and leaving the
// page ends the session.

import { $, V, apiKey, link, stage, state } from "./page.js";

const KEYMAP = {
  KeyW: "forward", ArrowUp: "forward",
  KeyS: "back", ArrowDown: "back",
  KeyA: "left", ArrowLeft: "left",
  KeyD: "right", ArrowRight: "right",
};
const MOUSE_PIXELS = 24; // pointer movement per action tick that means full deflection
const MOUSE_HZ = 30;

let keys = new Set();
const mouse = { dx: 0, dy: 0, active: false };

function sendAction() {
  if (!link.conn || state.ended) return;
  const clip = (x) => Math.max(-1, Math.min(1, x));
  const m = [clip(mouse.dx / MOUSE_PIXELS), clip(mouse.dy / MOUSE_PIXELS)];
  mouse.dx = 0;
  mouse.dy = 0;
  state.seq += 1;
  state.pending.set(state.seq, performance.now());
  if (state.pending.size > 64) state.pending.delete(state.pending.keys().next().value);
  link.conn.sendAction({ type: "action", v: V, seq: state.seq, keys: [...keys], mouse: m });
}

function typing(e) {
  return e.target instanceof HTMLInputElement || e.target instanceof HTMLTextAreaElement;
}

export function listen() {
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
    if (document.pointerLockElement !== stage && stage.requestPointerLock) {
      stage.requestPointerLock();
    }
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
    if (!text || !link.conn) return;
    state.promptId += 1;
    link.conn.sendControl({ type: "prompt", v: V, prompt: text, id: state.promptId });
    stage.focus();
  });

  window.addEventListener("pagehide", () => {
    // Leaving the page ends the session (a dropped connection only detaches it): 'close'
    // on the connection, and a DELETE (to the worker holding the session) that outlives
    // the page in case that is cut off.
    if (link.conn) {
      link.conn.sendControl({ type: "close", v: V, reason: "page closed" });
      link.conn.close();
    }
    if (state.session && !state.ended) {
      const headers = { "X-Session-Token": state.session.token };
      if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
      fetch(`${link.serverBase}/v1/sessions/${encodeURIComponent(state.session.id)}`,
        { method: "DELETE", keepalive: true, headers }).catch(() => {});
    }
  });
}
