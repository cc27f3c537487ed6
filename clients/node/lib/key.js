'use strict';
// The Idempotency-Key field (docs/http.md, "The rules"): exactly one RFC 8941
// sf-string without parameters, its content minKeyLength..maxKeyLength
// visible ASCII characters. Field lines arrive joined with commas, so two
// lines are two values: refused.

// A bare (unquoted) key, accepted only with bareKeys: true: visible ASCII
// without the characters that delimit structured fields.
const BARE_KEY = /^[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]+$/;
const KEY_CHARS = /^[\x21-\x7e]*$/;

/** {key, why}: the key, or null and why the field is refused. */
function parseKeyField(raw, { minKeyLength = 16, maxKeyLength = 255, bareKeys = false } = {}) {
  const s = raw.replace(/^[ \t]+|[ \t]+$/g, '');
  let key;
  if (s.startsWith('"')) {
    let out = '';
    let i = 1;
    for (;;) {
      if (i >= s.length) return { key: null, why: 'the quoted string is not terminated' };
      const ch = s[i];
      if (ch === '\\') {
        if (i + 1 >= s.length || (s[i + 1] !== '"' && s[i + 1] !== '\\')) {
          return { key: null, why: 'a backslash in a quoted string may only escape " or \\' };
        }
        out += s[i + 1];
        i += 2;
        continue;
      }
      if (ch === '"') break;
      const code = ch.charCodeAt(0);
      if (code < 0x20 || code > 0x7e) return { key: null, why: 'the quoted string holds a character outside printable ASCII' };
      out += ch;
      i += 1;
    }
    const rest = s.slice(i + 1).replace(/^[ \t]+/, '');
    if (rest) {
      return { key: null, why: rest.startsWith(',') ? 'the field holds more than one value' : 'text follows the quoted string (parameters are not allowed)' };
    }
    key = out;
  } else if (bareKeys && BARE_KEY.test(s)) {
    key = s;
  } else {
    return { key: null, why: 'the value must be one quoted string (RFC 8941 sf-string), e.g. "8e03978e-40d5-43e8-bc93-6894a57f9324"' };
  }
  if (key.length < minKeyLength || key.length > maxKeyLength) {
    return { key: null, why: `the key has ${key.length} characters; it must have ${minKeyLength} to ${maxKeyLength}` };
  }
  if (!KEY_CHARS.test(key)) return { key: null, why: 'the key must be visible ASCII characters (no spaces)' };
  return { key, why: '' };
}

module.exports = { parseKeyField };
