'use strict';
// The request fingerprint: a hash of what defines the operation (method,
// path, body in a canonical form), never of what changes between retries
// (authorization, Date, trace ids, the Idempotency-Key itself).
const crypto = require('node:crypto');

// JSON with object keys sorted at every level and no insignificant
// whitespace, so that a client re-serialising the same body with another key
// order or spacing sends the same fingerprint. Numbers are written as
// JavaScript writes them after parsing (1.0 and 1 are the same number here).
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

// The canonical form of a request: "METHOD path\n" followed by the body
// (canonical JSON for a parsed body, the raw bytes for a string or Buffer).
function canonicalRequest({ method, path, body }, exclude) {
  let bodyText;
  if (body === undefined || body === null) bodyText = '';
  else if (Buffer.isBuffer(body)) bodyText = body.toString('base64');
  else if (typeof body === 'string') bodyText = body;
  else bodyText = canonicalJson(withoutFields(body, exclude));
  return String(method).toUpperCase() + ' ' + path + '\n' + bodyText;
}

// 32 hex digits (128 bits) of SHA-256: plenty to tell two requests apart,
// and half the bytes per stored claim.
function fingerprint(request, exclude) {
  return crypto.createHash('sha256').update(canonicalRequest(request, exclude), 'utf8').digest('hex').slice(0, 32);
}

module.exports = { canonicalJson, canonicalRequest, fingerprint, withoutFields };
