// What the server says, on either transport (protocol v1, protocol/codec.py): each message
// folded into the live state, the banner, or the picture.

import { drawJpeg } from "./jpeg.js";
import { banner, capacityBanner, takeApplied } from "./overlay.js";
import { $, state } from "./page.js";

export function onMessage(msg) {
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
