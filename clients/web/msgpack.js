// A tiny msgpack encoder/decoder: what protocol v1 needs, nothing else.
//
// Encodes null, booleans, numbers (integers up to 2^53 as ints, others as float64),
// strings (UTF-8), Uint8Array/ArrayBuffer (bin), arrays and plain objects (maps with
// string keys). Decodes every msgpack type except ext/timestamp (it throws on those).
// Usage: encode(value) -> Uint8Array; decode(Uint8Array | ArrayBuffer) -> value.

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder("utf-8", { fatal: true });

export function encode(value) {
  const out = new Writer();
  write(out, value);
  return out.bytes();
}

export function decode(data) {
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  const reader = new Reader(bytes);
  const value = reader.value();
  if (reader.pos !== bytes.length) throw new Error(`msgpack: ${bytes.length - reader.pos} trailing bytes`);
  return value;
}

class Writer {
  constructor() {
    this.buf = new Uint8Array(256);
    this.view = new DataView(this.buf.buffer);
    this.pos = 0;
  }
  reserve(n) {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.pos));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }
  u8(x) { this.reserve(1); this.view.setUint8(this.pos, x); this.pos += 1; }
  u16(x) { this.reserve(2); this.view.setUint16(this.pos, x); this.pos += 2; }
  u32(x) { this.reserve(4); this.view.setUint32(this.pos, x); this.pos += 4; }
  f64(x) { this.reserve(8); this.view.setFloat64(this.pos, x); this.pos += 8; }
  raw(bytes) { this.reserve(bytes.length); this.buf.set(bytes, this.pos); this.pos += bytes.length; }
  bytes() { return this.buf.slice(0, this.pos); }
}

function write(out, v) {
  if (v === null || v === undefined) return out.u8(0xc0);
  if (v === false) return out.u8(0xc2);
  if (v === true) return out.u8(0xc3);
  if (typeof v === "number") return writeNumber(out, v);
  if (typeof v === "string") {
    const b = textEncoder.encode(v);
    if (b.length < 32) out.u8(0xa0 | b.length);
    else if (b.length < 0x100) { out.u8(0xd9); out.u8(b.length); }
    else if (b.length < 0x10000) { out.u8(0xda); out.u16(b.length); }
    else { out.u8(0xdb); out.u32(b.length); }
    return out.raw(b);
  }
  if (v instanceof ArrayBuffer) v = new Uint8Array(v);
  if (v instanceof Uint8Array) {
    if (v.length < 0x100) { out.u8(0xc4); out.u8(v.length); }
    else if (v.length < 0x10000) { out.u8(0xc5); out.u16(v.length); }
    else { out.u8(0xc6); out.u32(v.length); }
    return out.raw(v);
  }
  if (Array.isArray(v)) {
    header(out, v.length, 0x90, 0xdc, 0xdd);
    for (const x of v) write(out, x);
    return;
  }
  if (typeof v === "object") {
    const keys = Object.keys(v).filter((k) => v[k] !== undefined);
    header(out, keys.length, 0x80, 0xde, 0xdf);
    for (const k of keys) { write(out, k); write(out, v[k]); }
    return;
  }
  throw new Error(`msgpack: cannot encode ${typeof v}`);
}

function header(out, n, fix, b16, b32) {
  if (n < 16) out.u8(fix | n);
  else if (n < 0x10000) { out.u8(b16); out.u16(n); }
  else { out.u8(b32); out.u32(n); }
}

function writeNumber(out, x) {
  if (!Number.isSafeInteger(x)) return (out.u8(0xcb), out.f64(x));
  if (x >= 0) {
    if (x < 0x80) return out.u8(x);
    if (x < 0x100) return (out.u8(0xcc), out.u8(x));
    if (x < 0x10000) return (out.u8(0xcd), out.u16(x));
    if (x < 0x100000000) return (out.u8(0xce), out.u32(x));
    out.u8(0xcf); out.u32(Math.floor(x / 0x100000000)); return out.u32(x >>> 0);
  }
  if (x >= -32) return out.u8(x & 0xff);
  if (x >= -0x80) { out.u8(0xd0); out.reserve(1); out.view.setInt8(out.pos, x); out.pos += 1; return; }
  if (x >= -0x8000) { out.u8(0xd1); out.reserve(2); out.view.setInt16(out.pos, x); out.pos += 2; return; }
  if (x >= -0x80000000) { out.u8(0xd2); out.reserve(4); out.view.setInt32(out.pos, x); out.pos += 4; return; }
  out.u8(0xd3); out.reserve(8); out.view.setBigInt64(out.pos, BigInt(x)); out.pos += 8;
}

class Reader {
  constructor(bytes) {
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
  }
  need(n) {
    if (this.pos + n > this.bytes.length) throw new Error("msgpack: truncated");
    const at = this.pos;
    this.pos += n;
    return at;
  }
  u8() { return this.view.getUint8(this.need(1)); }
  u16() { return this.view.getUint16(this.need(2)); }
  u32() { return this.view.getUint32(this.need(4)); }
  raw(n) { const at = this.need(n); return this.bytes.slice(at, at + n); }
  str(n) { const at = this.need(n); return textDecoder.decode(this.bytes.subarray(at, at + n)); }
  array(n) { const a = new Array(n); for (let i = 0; i < n; i++) a[i] = this.value(); return a; }
  map(n) {
    const m = {};
    for (let i = 0; i < n; i++) {
      const k = this.value();
      m[String(k)] = this.value();
    }
    return m;
  }
  big(signed) {
    const at = this.need(8);
    const v = signed ? this.view.getBigInt64(at) : this.view.getBigUint64(at);
    return Number(v); // exact up to 2^53, which is all the protocol uses
  }
  value() {
    const t = this.u8();
    if (t < 0x80) return t;
    if (t < 0x90) return this.map(t & 0x0f);
    if (t < 0xa0) return this.array(t & 0x0f);
    if (t < 0xc0) return this.str(t & 0x1f);
    if (t >= 0xe0) return t - 0x100;
    switch (t) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: return this.raw(this.u8());
      case 0xc5: return this.raw(this.u16());
      case 0xc6: return this.raw(this.u32());
      case 0xca: return this.view.getFloat32(this.need(4));
      case 0xcb: return this.view.getFloat64(this.need(8));
      case 0xcc: return this.u8();
      case 0xcd: return this.u16();
      case 0xce: return this.u32();
      case 0xcf: return this.big(false);
      case 0xd0: return this.view.getInt8(this.need(1));
      case 0xd1: return this.view.getInt16(this.need(2));
      case 0xd2: return this.view.getInt32(this.need(4));
      case 0xd3: return this.big(true);
      case 0xd9: return this.str(this.u8());
      case 0xda: return this.str(this.u16());
      case 0xdb: return this.str(this.u32());
      case 0xdc: return this.array(this.u16());
      case 0xdd: return this.array(this.u32());
      case 0xde: return this.map(this.u16());
      case 0xdf: return this.map(this.u32());
      default: throw new Error(`msgpack: unsupported type 0x${t.toString(16)}`);
    }
  }
}
