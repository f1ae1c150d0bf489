// The worldserve browser client: WebRTC video + data channels, or WebSocket + JPEG.
//
// Query parameters: transport=auto|webrtc|ws (auto: WebRTC, falling back to the
// WebSocket when it is unavailable, disabled or does not connect), prompt, seed, fps,
// bucket (default: the server's smallest), lookahead. An API key (when the server needs
// one) is typed into the page and kept in localStorage, never taken from the URL (page.js).
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
//
// Modules, one idea each: page (shared elements, parameters, state), overlay (banner,
// stats), messages (what the server says), session (where and how a session is opened and
// taken up again), rtc and ws (the two transports), jpeg (the WebSocket's pictures), input
// (keys, pointer, prompt), errors, msgpack.

import { listen } from "./input.js";
import { showStats } from "./overlay.js";
import { $, params } from "./page.js";
import { connect, detectMode, startRequest } from "./session.js";

showStats();
listen();
$("prompt").value = params.get("prompt") || "a green forest";
detectMode().then(() => connect(startRequest()));
