// The WebSocket's pictures: JPEG 'frame' messages drawn on the canvas, latest wins.

import { frameShown, recordLatency, takeApplied } from "./overlay.js";
import { canvas, state } from "./page.js";

const ctx = canvas.getContext("2d");
let decoding = false;
let nextFrame = null;

export function drawJpeg(msg) {
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
