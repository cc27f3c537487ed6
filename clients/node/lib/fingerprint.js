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

// The canonical form of a request: "METHOD target\nscope\n" followed by the
// canonical body, where target is the path with its query string (as
// received) and scope the key's scope ("<length>:<tenant>" or "-").
function canonicalRequest({ method, path, body, scope = '-' }, exclude) {
  return Buffer.concat([Buffer.from(`${String(method).toUpperCase()} ${path}\n${scope}\n`, 'utf8'), canonicalBody(body, exclude)]);
}

// 32 hex digits (128 bits) of SHA-256: plenty to tell two requests apart,
// and half the bytes per stored claim.
function fingerprint(request, exclude) {
  return crypto.createHash('sha256').update(canonicalRequest(request, exclude)).digest('hex').slice(0, 32);
}

module.exports = { canonicalJson, canonicalBody, canonicalRequest, fingerprint, withoutFields };
