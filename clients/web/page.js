// What the whole page shares: its elements, its query parameters, the live state that
// window.worldserve exposes (tests and debugging read it), and the link to the server.

export const V = 1; // protocol version

export const $ = (id) => document.getElementById(id);
export const video = $("video");
export const canvas = $("canvas");
export const stage = $("stage");

export const params = new URLSearchParams(location.search);

// The API key, when the server requires one: typed into the page's key form (shown when the
// server answers unauthorized) and kept in this browser's localStorage, never in a URL (URLs
// end up in history, logs and Referer headers). A leftover ?api_key= is dropped from the
// address bar unread.
const KEY_STORE = "worldserve.apiKey";
function storedKey() {
  try {
    return localStorage.getItem(KEY_STORE) || null;
  } catch {
    return null; // storage blocked: the key lasts as long as the page
  }
}
export let apiKey = storedKey();
export function setApiKey(key) {
  apiKey = key || null;
  try {
    if (apiKey) localStorage.setItem(KEY_STORE, apiKey);
    else localStorage.removeItem(KEY_STORE);
  } catch {
    // kept for this page only
  }
}
if (params.has("api_key")) {
  params.delete("api_key");
  const rest = params.toString();
  history.replaceState(null, "", `${location.pathname}${rest ? `?${rest}` : ""}${location.hash}`);
}
export const num = (name, dflt) => {
  const v = Number(params.get(name));
  return params.has(name) && Number.isFinite(v) ? v : dflt;
};

export const state = {
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

export const link = {
  conn: null, // the live transport
  serverBase: location.origin, // the worker's http base, where sessions open (a migrate moves it)
  routerBase: null, // router mode: the router that served the page
};
