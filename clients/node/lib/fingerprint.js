'use strict';
// The request fingerprint: a hash of what defines the operation (method,
// path, body in a canonical form), never of what changes between retries
// (authorization, Date, trace ids, the Idempotency-Key itself).
const crypto = require('node:crypto');

// JSON in one canonical form, RFC 8785 (JCS): object members sorted by
// their names' UTF-16 code units (what sort() compares), no insignificant
// whitespace, numbers as IEEE 754 doubles written as ECMAScript writes them
// (1.0, 1 and 1e0 are one number; digits beyond a double's precision do not
// count), strings as JSON.stringify escapes them. The same in every idem
// client (tests/middleware/conformance.json, "canonical_json").
function canonicalJson(value) {
  if (value === null || typeof value !== 'object') {
    const s = JSON.stringify(value);
    return s === undefined ? 'null' : s;
  }
  if (Array.isArray(value)) return '[' + value.map(canonicalJson).join(',') + ']';
  if (typeof value.toJSON === 'function') return canonicalJson(value.toJSON());
  const keys = Object.keys(value).filter((k) => value[k] !== undefined).sort();
  return '{' + keys.map((k) => JSON.stringify(k) + ':' + canonicalJson(value[k])).join(',') + '}';
}

// A copy of `body` without the fields named in `exclude` ('field' or
// 'dotted.path'): fields that legitimately differ between retries.
function withoutFields(body, exclude) {
  if (!exclude || exclude.length === 0 || body === null || typeof body !== 'object' || Buffer.isBuffer(body)) return body;
  const copy = structuredClone(body);
  for (const path of exclude) {
    const parts = String(path).split('.');
    let node = copy;
    for (let i = 0; i < parts.length - 1 && node && typeof node === 'object'; i++) node = node[parts[i]];
    if (node && typeof node === 'object') delete node[parts[parts.length - 1]];
  }
  return copy;
}

// The body's canonical bytes: a parsed body (or a string or Buffer that
// parses as JSON) as canonical JSON, less the excluded fields; other bodies
// as their bytes; none as nothing.
function canonicalBody(body, exclude) {
  if (body === undefined || body === null) return Buffer.alloc(0);
  if (typeof body === 'string' || Buffer.isBuffer(body)) {
    const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body, 'utf8');
    if (bytes.toString('utf8').trim() === '') return Buffer.alloc(0);
    try {
      return Buffer.from(canonicalJson(withoutFields(JSON.parse(bytes.toString('utf8')), exclude)), 'utf8');
    } catch {
      return bytes;
    }
  }
  return Buffer.from(canonicalJson(withoutFields(body, exclude)), 'utf8');
}

const isUnreserved = (b) => (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a) || (b >= 0x30 && b <= 0x39)
  || b === 0x2d || b === 0x2e || b === 0x5f || b === 0x7e; // ALPHA DIGIT - . _ ~ (RFC 3986)
const pct = (b) => `%${b.toString(16).toUpperCase().padStart(2, '0')}`;

// The canonical request target (docs/http.md, "The fingerprint"), the same
// whether a framework gives the path raw (node) or decoded (Starlette,
// Django, Go): the path percent-decoded once, then every byte but the
// unreserved characters and "/" percent-encoded in upper-case hex; the
// query as sent, its escapes normalised (upper-case hex, unreserved
// characters decoded: RFC 3986, 6.2.2); "?" only before a query.
function canonicalTarget(target) {
  const s = String(target);
  const q = s.indexOf('?');
  const raw = Buffer.from(q < 0 ? s : s.slice(0, q), 'utf8');
  const bytes = [];
  for (let i = 0; i < raw.length; i++) {
    const hex = raw[i] === 0x25 && i + 2 < raw.length ? raw.toString('latin1', i + 1, i + 3) : '';
    if (/^[0-9A-Fa-f]{2}$/.test(hex)) {
      bytes.push(parseInt(hex, 16));
      i += 2;
    } else bytes.push(raw[i]);
  }
  let path = '';
  for (const b of bytes) path += isUnreserved(b) || b === 0x2f ? String.fromCharCode(b) : pct(b);
  const query = q < 0 ? '' : s.slice(q + 1).replace(/%([0-9A-Fa-f]{2})/g, (_, h) => {
    const b = parseInt(h, 16);
    return isUnreserved(b) ? String.fromCharCode(b) : pct(b);
  });
  return query ? `${path}?${query}` : path;
}

// The canonical form of a request: "METHOD target\nscope\n" followed by the
// canonical body, where target is the canonical target of the path with its
// query string and scope the key's scope ("<length>:<tenant>" or "-").
function canonicalRequest({ method, path, body, scope = '-' }, exclude) {
  return Buffer.concat([Buffer.from(`${String(method).toUpperCase()} ${canonicalTarget(path)}\n${scope}\n`, 'utf8'),
    canonicalBody(body, exclude)]);
}

// 32 hex digits (128 bits) of SHA-256: plenty to tell two requests apart,
// and half the bytes per stored claim.
function fingerprint(request, exclude) {
  return crypto.createHash('sha256').update(canonicalRequest(request, exclude)).digest('hex').slice(0, 32);
}

module.exports = { canonicalJson, canonicalBody, canonicalRequest, canonicalTarget, fingerprint, withoutFields };
