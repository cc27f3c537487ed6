'use strict';
// The pure parts of the installed idem-pg, without a database: the
// canonical request behind the fingerprint, the key header's parsing, the
// stored document and its replay (also of a document docs/http.md's SQL
// handler stores), the transient SQLSTATEs. Run by
// tests/scenarios/clients.sh middleware_node with node --test.
const test = require('node:test');
const assert = require('node:assert/strict');
const { canonicalJson, canonicalBody, canonicalTarget, canonicalRequest, fingerprint, replay, storedResponse, isTransient, Idem, parseKeyField, defaultStore, PROBLEMS } = require('idem-pg');
const table = require('./conformance.json');

test('canonical JSON: keys sorted at every level, no whitespace', () => {
  assert.equal(canonicalJson({ b: 1, a: { d: [2, { f: 1, e: 0 }], c: 'x' } }), '{"a":{"c":"x","d":[2,{"e":0,"f":1}]},"b":1}');
  assert.equal(canonicalJson(JSON.parse('{ "qty": 2,   "sku": "sku-1" }')), canonicalJson({ sku: 'sku-1', qty: 2 }));
});

test('fingerprint: same operation, same print; method, path, body each change it', () => {
  const base = { method: 'POST', path: '/orders', body: { sku: 'a', qty: 1 } };
  const fp = fingerprint(base);
  assert.match(fp, /^[0-9a-f]{32}$/);
  assert.equal(fingerprint({ ...base, method: 'post', body: { qty: 1, sku: 'a' } }), fp);
  assert.notEqual(fingerprint({ ...base, method: 'PUT' }), fp);
  assert.notEqual(fingerprint({ ...base, path: '/orders?dry=1' }), fp);
  assert.notEqual(fingerprint({ ...base, body: { sku: 'a', qty: 2 } }), fp);
});

test('fingerprint: excluded fields (top level and dotted) do not count, and the body is not modified', () => {
  const body = { sku: 'a', client_ts: 1, meta: { trace: 'x', keep: 1 } };
  const a = fingerprint({ method: 'POST', path: '/o', body }, ['client_ts', 'meta.trace']);
  const b = fingerprint({ method: 'POST', path: '/o', body: { sku: 'a', client_ts: 2, meta: { trace: 'y', keep: 1 } } }, ['client_ts', 'meta.trace']);
  assert.equal(a, b);
  assert.notEqual(a, fingerprint({ method: 'POST', path: '/o', body: { sku: 'a', meta: { keep: 2 } } }, ['client_ts', 'meta.trace']));
  assert.equal(body.client_ts, 1);
  assert.equal(body.meta.trace, 'x');
});

test('canonical request: the scope, and raw string and Buffer bodies as they are unless they are JSON', () => {
  assert.equal(canonicalRequest({ method: 'post', path: '/p', body: 'a=1&b=2' }).toString(), 'POST /p\n-\na=1&b=2');
  assert.equal(canonicalRequest({ method: 'POST', path: '/p', scope: '4:acme' }).toString(), 'POST /p\n4:acme\n');
  assert.equal(canonicalRequest({ method: 'POST', path: '/p', body: Buffer.from('{"b":1.0, "a":2}') }).toString(), 'POST /p\n-\n{"a":2,"b":1}');
  assert.notEqual(fingerprint({ method: 'POST', path: '/p', body: {}, scope: '4:acme' }), fingerprint({ method: 'POST', path: '/p', body: {} }));
});

test('canonical JSON: the pairs every idem client checks (conformance.json)', () => {
  for (const [given, canonical] of table.canonical_json) assert.equal(canonicalJson(JSON.parse(given)), canonical, given);
  assert.ok(table.canonical_json.length > 10);
});

test('canonical body and target: the pairs every idem client checks (conformance.json)', () => {
  for (const [given, canonical] of table.canonical_body) assert.equal(canonicalBody(given).toString('utf8'), canonical, given);
  for (const [given, canonical] of table.canonical_target) assert.equal(canonicalTarget(given), canonical, given);
  assert.ok(table.canonical_body.length > 5 && table.canonical_target.length > 5);
});

test('the key field: one sf-string, 16 to 255 visible ASCII characters', () => {
  const k = 'k'.repeat(16);
  assert.equal(parseKeyField(`"${k}"`).key, k);
  assert.equal(parseKeyField(k).key, null, 'bare only with bareKeys');
  assert.equal(parseKeyField(k, { bareKeys: true }).key, k);
  assert.equal(parseKeyField(`"${k}\\"b"`).key, `${k}"b`);
  for (const bad of [`"${k}`, '""', `"${k}", "${k}"`, `"${k}";a=1`, `"${'k'.repeat(256)}"`, `"${'k'.repeat(15)}"`, `"has space ${k}"`, `"${k}\\x"`]) {
    assert.equal(parseKeyField(bad).key, null, bad);
  }
  assert.equal(parseKeyField(`"${'k'.repeat(255)}"`).key, 'k'.repeat(255));
});

test('what is stored: 2xx, 3xx, deterministic 4xx; never 401, 403, 407, 408, 425, 429, 5xx', () => {
  for (const s of [200, 201, 204, 303, 400, 404, 409, 422]) assert.ok(defaultStore(s), String(s));
  for (const s of [401, 403, 407, 408, 425, 429, 500, 502, 503, 504]) assert.ok(!defaultStore(s), String(s));
  for (const [slug, [status, title]] of Object.entries(table.problems)) assert.deepEqual(PROBLEMS[slug], [status, title], slug);
});

test('stored response: chosen headers only, exact bytes, base64 for binary, body omitted when streamed', () => {
  const route = { storeHeaders: ['content-type', 'location'] };
  const json = Buffer.from('{"b":1,"a":2}');
  const doc = storedResponse(route, 201, { 'content-type': 'application/json', location: '/o/1', 'set-cookie': 's=1' }, json, false);
  assert.deepEqual(doc, { status: 201, headers: { 'content-type': 'application/json', location: '/o/1' }, body: '{"b":1,"a":2}' });
  const r = replay(JSON.parse(JSON.stringify(doc)));
  assert.equal(r.status, 201);
  assert.ok(r.body.equals(json), 'byte for byte, key order kept');
  assert.equal(r.headers['idempotent-replayed'], 'true');
  const bin = Buffer.from([0xff, 0x00, 0xfe]);
  const d2 = storedResponse(route, 200, {}, bin, false);
  assert.equal(d2.encoding, 'base64');
  assert.ok(replay(d2).body.equals(bin));
  const d3 = storedResponse(route, 200, { 'content-type': 'text/plain' }, null, true);
  assert.deepEqual(replay(d3).headers, { 'content-type': 'text/plain', 'idempotent-replayed': 'true', 'idempotent-body-omitted': 'true' });
});

test("replay of docs/http.md's SQL handler document (a JSON body) and of a claim finished without a result", () => {
  const r = replay({ status: 201, headers: { Location: '/orders/1' }, body: { order_id: 1 } });
  assert.equal(r.status, 201);
  assert.equal(r.headers.location, '/orders/1');
  assert.equal(r.headers['content-type'], 'application/json');
  assert.deepEqual(JSON.parse(r.body.toString()), { order_id: 1 });
  for (const result of [null, { order_id: 1 }, { status: '201' }, [1]]) {
    const empty = replay(result, 'completed');
    assert.equal(empty.status, 204, JSON.stringify(result));
    assert.equal(empty.body, null);
    assert.deepEqual(empty.headers, { 'idempotent-replayed': 'true' }, "other code's result is not shown");
    const failed = replay(result, 'failed', { problemBase: 'https://x.test/p#' });
    assert.equal(failed.status, 422);
    assert.equal(JSON.parse(failed.body.toString()).type, 'https://x.test/p#response-not-replayable');
    assert.equal(failed.headers['idempotent-replayed'], undefined);
  }
});

test('transient errors: the four SQLSTATEs and lost connections; others are not', () => {
  for (const code of ['40001', '40P01', '55P03', '57014', '08006', 'ECONNRESET']) assert.ok(isTransient({ code }), code);
  assert.ok(isTransient(new Error('Connection terminated unexpectedly')));
  for (const code of ['ID001', '23505', '22023', '42501']) assert.ok(!isTransient({ code }), code);
});

test('the key header: missing, malformed, quoted, too long with the tenant; bad options refused', async () => {
  const pool = { connect: async () => { throw Object.assign(new Error('no server in this test'), { code: 'ECONNREFUSED' }); } };
  const idem = new Idem({ pool, tenant: () => 'x'.repeat(1001) });
  const route = idem.route({ bizType: 'orders.create' });
  const req = (headers) => ({ method: 'POST', path: '/o', headers, body: {} });
  assert.equal((await idem.begin(req({}), route, {})).response.status, 400);
  assert.equal((await idem.begin(req({ 'idempotency-key': '"short"' }), route, {})).response.status, 400);
  assert.equal((await idem.begin(req({ 'idempotency-key': '"a b c d e f g h i j k"' }), route, {})).response.status, 400);
  // Quoted (a structured-field string) and valid, but 4 + 1 + 1001 + 1 + 23 bytes with the tenant exceed 1024.
  assert.equal((await idem.begin(req({ 'idempotency-key': '"0190c4c2-7d6e-7a34-9c4f"' }), route, {})).response.status, 400);
  // No tenant, no anonymous scope: 500 tenant-missing, logged.
  const logged = [];
  const guest = new Idem({ pool, tenant: () => null, logger: { error: (m) => logged.push(m) } });
  const g = await guest.begin(req({ 'idempotency-key': '"0190c4c2-7d6e-7a34-9c4f"' }), guest.route({ bizType: 'orders.create' }), {});
  assert.equal(g.response.status, 500);
  assert.match(JSON.parse(g.response.body).type, /#tenant-missing$/);
  assert.match(logged[0], /no tenant/);
  // Unscoped: refused when the route is made (at start-up).
  assert.throws(() => new Idem({ pool }).route({ bizType: 'orders.create' }), /choose the key scope/);
  assert.throws(() => new Idem({ pool, singleTenant: true, tenant: () => 't' }).route({ bizType: 'orders.create' }), /exclude/);
  assert.ok(new Idem({ pool, singleTenant: true }).route({ bizType: 'orders.create' }));
  const short = new Idem({ pool, tenant: () => 't' });
  const r = await short.begin(req({ 'idempotency-key': '"0190c4c2-7d6e-7a34-9c4f"' }), short.route({ bizType: 'orders.create' }), {});
  assert.equal(r.response.status, 503, 'a valid key reaches the pool (which refuses here: 503 with Retry-After)');
  assert.equal(r.response.headers['retry-after'], '1');
  assert.throws(() => idem.route({ bizType: 'bad type!' }), /bizType/);
  assert.throws(() => idem.route({ bizType: 'ok', lease: 0.5 }), /lease/);
  assert.throws(() => new Idem({}), /pool/);
});

test('express: a body a parser read without verify: idem.rawBody is refused (500, the reason in the error), never fingerprinted as parsed', async () => {
  const express = require('express');
  // No request reaches the pool: the refusal comes first.
  const idem = new Idem({ pool: { connect: async () => { throw new Error('the pool was reached'); } }, singleTenant: true });
  const app = express();
  app.use(express.urlencoded({ extended: false }));
  app.post('/form', idem.express({ bizType: 'unit.form' }), (req, res) => res.status(201).end());
  let seen = null;
  app.use((err, req, res, next) => {
    seen = err;
    res.status(500).end();
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  try {
    const r = await fetch(`http://127.0.0.1:${server.address().port}/form`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', 'idempotency-key': '"0123456789abcdef-form"' },
      body: 'b=2&a=1',
    });
    assert.equal(r.status, 500);
    assert.match(String(seen && seen.message), /verify: idem\.rawBody/);
  } finally {
    server.close();
  }
});
