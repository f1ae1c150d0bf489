// The WebRTC transport: an offer (POST /v1/rtc/offer) opens or resumes the session, the
// video track carries the picture, the 'control' data channel carries every message but
// actions, which go unordered and without retransmits on 'actions'.

import { OfferError } from "./errors.js";
import { decode, encode } from "./msgpack.js";
import { onMessage } from "./messages.js";
import { frameShown, recordLatency } from "./overlay.js";
import { canvas, link, state, video } from "./page.js";

const CONNECT_TIMEOUT_MS = 10000;

export class RtcTransport {
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
    const resp = await fetch(`${link.serverBase}/v1/rtc/offer`, {
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
