// The WebSocket transport: every message on the socket (GET /v1/ws), frames as JPEG
// 'frame' messages (jpeg.js draws them).

import { OfferError } from "./errors.js";
import { decode, encode } from "./msgpack.js";
import { onMessage } from "./messages.js";
import { V, canvas, link, state, video } from "./page.js";

export class WsTransport {
  constructor() {
    this.name = "ws";
    this.ws = null;
    this.closed = false;
    this.onDown = null;
  }

  open(request) {
    const url = `${link.serverBase.replace(/^http/, "ws")}/v1/ws`; // http -> ws, https -> wss
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
