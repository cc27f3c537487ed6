'use strict';
// Runs tests/middleware/conformance.json (copied next to this file) against
// a running server (the format and the server it needs:
// tests/middleware/README.md), with node:http requests (several header lines
// of one name are sent as they are) and a database connection of its own for
// the rows and the advisory lock of a held request. Called by driver.js.
const http = require('node:http');
const crypto = require('node:crypto');
const { Client } = require('pg');

const TABLE = require('./conformance.json');
const WAITING = `SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                 AND objid::bigint = (hashtext($1)::bigint & 4294967295)`;

const expand = (s, u) => s.split('{u}').join(u).replace(/\{x\*(\d+)\}/g, (_, n) => 'x'.repeat(Number(n)));

function send(base, kase, req, u) {
  const d = TABLE.defaults;
  let path = req.route || kase.route || d.route;
  if (req.query) path += `?${req.query}`;
  const headers = [['content-type', req.content_type || 'application/json']];
  for (const line of req.key || []) headers.push(['idempotency-key', expand(line, u)]);
  const tenant = 'tenant' in req ? req.tenant : d.tenant;
  if (tenant !== null) headers.push(['x-tenant', tenant]);
  if ('status' in req) headers.push(['x-conformance-status', String(req.status)]);
  if ('fail' in req) headers.push(['x-conformance-fail', req.fail]);
  if ('pad' in req) headers.push(['x-conformance-pad', String(req.pad)]);
  if (req.hold) headers.push(['x-conformance-hold', u]);
  const body = Buffer.from(expand('body' in req ? req.body : d.body, u), 'utf8');
  headers.push(['content-length', String(body.length)]);
  const url = new URL(base + path);
  return new Promise((resolve) => {
    // A name given an array of values is sent as that many field lines.
    const h = {};
    for (const [name, value] of headers) h[name] = name in h ? [].concat(h[name], value) : value;
    const r = http.request({ host: url.hostname, port: url.port, path: url.pathname + url.search, method: 'POST',
      headers: h }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    r.on('error', () => resolve(null));
    r.end(body);
  });
}

function json(r) {
  try {
    return JSON.parse(r.body.toString('utf8'));
  } catch {
    return null;
  }
}

// Idempotent-Expires: absent, or an IMF-fixdate in the future.
function expiresVerdict(value, want) {
  if (!want) return value === undefined ? [] : [`Idempotent-Expires ${value}, expected none`];
  if (value === undefined || !/^[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT$/.test(value)
      || Number.isNaN(Date.parse(value))) {
    return [`Idempotent-Expires ${value} is not an HTTP-date (IMF-fixdate)`];
  }
  return Date.parse(value) > Date.now() ? [] : [`Idempotent-Expires ${value} is not in the future`];
}

// What differs from `exp` (empty: the response conforms).
function verdict(r, exp, seen) {
  if (!r) return ['no response'];
  const bad = [];
  const status = exp.problem ? TABLE.problems[exp.problem][0] : exp.status;
  if (status !== undefined && r.status !== status) bad.push(`status ${r.status}, expected ${status}`);
  const replayed = r.headers['idempotent-replayed'] === 'true';
  const wantReplayed = exp.problem ? false : exp.replayed;
  if (wantReplayed !== undefined && replayed !== wantReplayed) bad.push(`replayed=${replayed}`);
  for (const [name, value] of Object.entries(exp.headers || {})) {
    const got = r.headers[name] === undefined ? null : r.headers[name];
    if (got !== value) bad.push(`header ${name}: ${JSON.stringify(got)}, expected ${JSON.stringify(value)}`);
  }
  if (exp.problem) {
    const doc = json(r) || {};
    const [pstatus, title] = TABLE.problems[exp.problem];
    if (!String(r.headers['content-type'] || '').startsWith('application/problem+json')) bad.push(`content-type ${r.headers['content-type']}`);
    const want = { type: TABLE.problem_base + exp.problem, title, status: pstatus };
    for (const [k, v] of Object.entries(want)) if (doc[k] !== v) bad.push(`problem ${k}: ${JSON.stringify(doc[k])}, expected ${JSON.stringify(v)}`);
    if (typeof doc.detail !== 'string' || !doc.detail) bad.push('problem without a detail');
  }
  if (exp.ran) {
    const ids = new Set(seen.filter(Boolean).map((s) => (json(s) || {}).id));
    const id = (json(r) || {}).id;
    if (id === undefined || ids.has(id) || replayed) bad.push(`the handler did not run for it (id ${id}, replayed=${replayed})`);
  }
  if (exp.expires !== undefined) bad.push(...expiresVerdict(r.headers['idempotent-expires'], exp.expires));
  if (exp.same_as !== undefined) {
    const first = seen[exp.same_as];
    if (!first || !r.body.equals(first.body)) bad.push(`body ${r.body.toString().slice(0, 80)} differs from request ${exp.same_as}'s`);
    for (const h of ['content-type', 'location']) {
      if (first && r.headers[h] !== first.headers[h]) bad.push(`${h} ${r.headers[h]}, the first had ${first.headers[h]}`);
    }
  }
  return bad;
}

async function runCase(base, db, kase) {
  const u = crypto.randomBytes(6).toString('hex');
  const reqs = kase.requests;
  const responses = new Array(reqs.length).fill(null);
  const problems = [];
  const check = (i) => {
    for (const b of verdict(responses[i], reqs[i].expect, responses.slice(0, i))) problems.push(`request ${i}: ${b}`);
  };
  if (kase.configure) {
    // The business type's failure policy (its TTL the default), before the requests.
    await db.query('SELECT idem_configure($1, NULL, $2)', [kase.configure.biz_type, kase.configure.on_failure]);
  }
  if (kase.seed) {
    // A claim finished by other code (a SQL handler, a consumer), before the requests.
    const s = kase.seed;
    const claim = expand(s.claim, u);
    await db.query('BEGIN');
    await db.query('SELECT idem_claim($1, $2)', [claim, s.biz_type]);
    await db.query(`SELECT ${s.state === 'completed' ? 'idem_complete' : 'idem_fail'}($1, $2, $3::jsonb)`,
      [claim, s.biz_type, s.result === null ? null : JSON.stringify(s.result)]);
    await db.query('COMMIT');
  }
  const holding = reqs.some((r) => r.hold);
  if (holding) await db.query('SELECT pg_advisory_lock(hashtext($1))', [u]);
  const held = [];
  for (let i = 0; i < reqs.length; i++) {
    const req = reqs[i];
    if (req.after_release) continue;
    if (req.hold) {
      held.push([i, send(base, kase, req, u).then((r) => { responses[i] = r; })]);
      // A hang guard, not a verdict: the held request waits for our lock.
      let waiting = false;
      for (let n = 0; n < 12000 && !waiting; n++) {
        waiting = Number((await db.query(WAITING, [u])).rows[0].n) > 0;
        if (!waiting) await new Promise((res) => setTimeout(res, 5));
      }
      if (!waiting) problems.push(`request ${i} never waited for the hold`);
      continue;
    }
    responses[i] = await send(base, kase, req, u);
    check(i);
  }
  if (holding) await db.query('SELECT pg_advisory_unlock(hashtext($1))', [u]);
  for (const [i, p] of held) {
    await p;
    check(i);
  }
  for (let i = 0; i < reqs.length; i++) {
    if (!reqs[i].after_release) continue;
    responses[i] = await send(base, kase, reqs[i], u);
    check(i);
  }
  const rows = Number((await db.query('SELECT count(*) AS n FROM conformance_rows WHERE run = $1', [u])).rows[0].n);
  if (rows !== kase.rows) problems.push(`${rows} business row(s), expected ${kase.rows}`);
  return problems;
}

async function run(base, check) {
  const db = new Client();
  await db.connect();
  try {
    await db.query(`CREATE TABLE IF NOT EXISTS conformance_rows (id bigserial PRIMARY KEY, run text NOT NULL,
                    tenant text, status int NOT NULL)`);
    for (const kase of TABLE.cases) {
      const problems = await runCase(base, db, kase);
      check(problems.length === 0, `conformance: ${kase.name}${problems.length ? ': ' + problems.join('; ') : ''}`);
    }
  } finally {
    await db.end();
  }
}

module.exports = { run, TABLE };
