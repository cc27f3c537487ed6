'use strict';
// The test servers of tests/scenarios/clients.sh middleware_node: one app per
// framework on the installed idem-pg package, on 127.0.0.1 and a free port.
//   node server.js express|fastify
// prints "listening PORT", then one line per test point it reaches:
//   "holding KEY"          the handler of KEY waits for POST /test/release/KEY
//   "paused POINT KEY"     KEY stopped for good at POINT (before-commit,
//                          after-commit, after-checkpoint): the test kills the
//                          process there
// The pause and hold points are chosen by test-only request headers
// (X-Test-Pause, X-Test-Hold), which are not part of the fingerprint.
// The pool connects with the libpq variables (PGHOST, PGPORT, ...).
const { Pool } = require('pg');
const { createIdem } = require('idem-pg');

const framework = process.argv[2];
const providerUrl = process.env.PROVIDER_URL;
const pool = new Pool({ max: 40 });
pool.on('error', () => {}); // an idle connection lost: the pool replaces it

const never = () => new Promise(() => {});
const pauseAt = (point) => async (ctx) => {
  if (header(ctx.request, 'x-test-pause') === point) {
    console.log(`paused ${point} ${ctx.key}`);
    await never();
  }
};
const killPoints = { beforeCommit: pauseAt('before-commit'), afterCommit: pauseAt('after-commit') };
const conformanceTable = require('./conformance.json');
// IDEM_TEST_SCOPE: "tenant" (the default: the X-Tenant hook), "single"
// (singleTenant: true), "none" (neither: refused at start-up, which the
// driver checks).
const scopeOptions = {
  // Stand-in for authentication: the tenant of the caller (none without the header).
  tenant: { tenant: (req) => header(req, 'x-tenant') || null },
  single: { singleTenant: true },
  none: {},
}[process.env.IDEM_TEST_SCOPE || 'tenant'];
const idem = createIdem({
  pool,
  ...scopeOptions,
  storeHeaders: ['content-type', 'location', 'x-order-id'],
  problemBase: conformanceTable.problem_base,
});

function header(req, name) {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

const holds = new Map(); // key -> release function
function hold(key) {
  return new Promise((resolve) => {
    holds.set(key, resolve);
    console.log(`holding ${key}`);
  });
}

// The business operation, on the request's transaction. Returns the answer.
async function createOrder(ctx, req, body, route) {
  if (header(req, 'x-test-hold')) await hold(ctx.key);
  if (body.sku === 'out-of-stock') {
    // A deterministic business failure: nothing written, the answer stored.
    return { status: 422, body: { error: 'out of stock', sku: body.sku } };
  }
  const r = await ctx.query('INSERT INTO orders (route, idem_key, sku, qty) VALUES ($1, $2, $3, $4) RETURNING id',
    [route, ctx.key, body.sku, body.qty]);
  const id = r.rows[0].id;
  if (header(req, 'x-test-throw')) throw new Error('handler failed after its write');
  if (header(req, 'x-test-terminate')) {
    // The connection is lost mid-transaction (the server ends this backend).
    await ctx.query('SELECT pg_terminate_backend(pg_backend_pid())');
  }
  if (header(req, 'x-test-sqlstate')) {
    await ctx.query(`DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '${header(req, 'x-test-sqlstate').replace(/[^0-9A-Z]/g, '')}'; END $$`);
  }
  return { status: 201, headers: { location: `/orders/${id}`, 'x-order-id': String(id) }, body: { order_id: Number(id), sku: body.sku, qty: body.qty } };
}

// Lease mode: an external call (the test's provider), a recovery point, then
// the business write in the second transaction.
async function createCharge(ctx, req, body) {
  let chargeId;
  if (ctx.lease.recoveryPoint === 'charged') {
    chargeId = ctx.lease.recoveryData.charge_id; // resume: the provider is not called again
  } else {
    const r = await fetch(`${providerUrl}/charge`, { method: 'POST', body: JSON.stringify({ key: ctx.key, amount: body.amount }) });
    chargeId = (await r.json()).charge_id;
    await ctx.checkpoint('charged', { charge_id: chargeId });
  }
  if (header(req, 'x-test-pause') === 'after-checkpoint') {
    console.log(`paused after-checkpoint ${ctx.key}`);
    await never();
  }
  await ctx.query('INSERT INTO charges (idem_key, charge_id) VALUES ($1, $2)', [ctx.key, chargeId]);
  return { status: 201, body: { charge_id: chargeId, attempt: ctx.lease.attempt } };
}

// The conformance server of tests/middleware/README.md: its routes and handler.
const conformanceRoutes = [
  ['/conformance/orders', { bizType: 'conformance.orders', storeHeaders: ['content-type', 'location'] }],
  ['/conformance/orders-nowait', { bizType: 'conformance.nowait', wait: false, storeHeaders: ['content-type', 'location'] }],
  ['/conformance/orders-short-wait', { bizType: 'conformance.shortwait', lockTimeout: 200, storeHeaders: ['content-type', 'location'] }],
  ['/conformance/orders-anonymous', { bizType: 'conformance.anonymous', anonymous: true, storeHeaders: ['content-type', 'location'] }],
  ['/conformance/orders-2xx-only', { bizType: 'conformance.only2xx', store: (s) => s >= 200 && s < 300, storeHeaders: ['content-type', 'location'] }],
  // Lease mode: the handler's writes are the second transaction on ctx.client.
  ['/conformance/orders-lease', { bizType: 'conformance.lease', lease: 60, storeHeaders: ['content-type', 'location'] }],
  // The runner configures conformance.retry with on_failure => 'retry'.
  ['/conformance/orders-retry', { bizType: 'conformance.retry', storeHeaders: ['content-type', 'location'] }],
];
async function conformance(ctx, req, body) {
  const hold = header(req, 'x-conformance-hold');
  if (hold) await ctx.query('SELECT pg_advisory_xact_lock(hashtext($1))', [hold]);
  const status = Number(header(req, 'x-conformance-status') || 201);
  const r = await ctx.query('INSERT INTO conformance_rows (run, tenant, status) VALUES ($1, $2, $3) RETURNING id',
    [body.run, header(req, 'x-tenant') || null, status]);
  const id = Number(r.rows[0].id);
  const fail = header(req, 'x-conformance-fail');
  if (fail) await ctx.query(`DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '${fail.replace(/[^0-9A-Z]/g, '')}'; END $$`);
  const pad = Number(header(req, 'x-conformance-pad') || 0);
  const headers = { location: `/conformance/rows/${id}`, 'x-conformance-row': String(id), 'x-conformance-attempt': String(ctx.attempt) };
  const previous = ctx.previousError;
  if (previous && Number.isInteger(previous.status)) headers['x-conformance-previous-status'] = String(previous.status);
  return { status, headers, body: pad ? { id, pad: 'x'.repeat(pad) } : { id } };
}

const routes = [
  ...conformanceRoutes.map(([path, options]) => [path, options, conformance, 'request']),
  // [path, route options, operation, where the handler finds its context]
  // The kill points are hooks of these routes only: the conformance routes
  // run without hooks, the way most apps do (the response stored and
  // committed in one round trip).
  ['/orders', { bizType: 'orders.create', hooks: killPoints }, createOrder, 'request'],
  ['/orders-nowait', { bizType: 'orders.nowait', wait: false, hooks: killPoints }, createOrder, 'als'],
  ['/orders-short-wait', { bizType: 'orders.shortwait', lockTimeout: 100, hooks: killPoints }, createOrder, 'request'],
  ['/orders-optional', { bizType: 'orders.optional', required: false, hooks: killPoints }, createOrder, 'request'],
  ['/charges', { bizType: 'charges.create', lease: 2, retryAfter: 2, hooks: killPoints }, createCharge, 'request'],
];

async function runOperation(idemCtx, op, req, body, path, where) {
  // The ALS route reads its context where a deeper layer would: after an await.
  await new Promise((r) => setImmediate(r));
  const ctx = where === 'als' ? idem.current() : idemCtx;
  if (!ctx || ctx !== idemCtx) throw new Error('idem context not found');
  return op(ctx, req, body, path);
}

async function express() {
  const express = require('express');
  const app = express();
  // The parsers keep the bytes the fingerprint counts (a form's fields as
  // sent, not as parsed: tests/middleware/conformance.json's form cases).
  app.use(express.json({ verify: idem.rawBody }), express.urlencoded({ extended: true, verify: idem.rawBody }));
  for (const [path, options, op, where] of routes) {
    app.post(path, idem.express(options), async (req, res) => {
      const out = await runOperation(req.idem, op, req, req.body, path, where);
      res.status(out.status).set(out.headers || {}).json(out.body);
    });
  }
  // A streamed answer (res.write): passed through, stored without its body.
  app.post('/reports', idem.express({ bizType: 'reports.create' }), async (req, res) => {
    await req.idem.query('INSERT INTO orders (route, idem_key, sku, qty) VALUES ($1, $2, $3, $4)', ['/reports', req.idem.key, 'report', 1]);
    res.status(200).set('content-type', 'text/plain');
    for (let i = 1; i <= 3; i++) res.write(`line ${i}\n`);
    res.end();
  });
  app.post('/test/release/:key', (req, res) => {
    const release = holds.get(req.params.key);
    holds.delete(req.params.key);
    if (release) release();
    res.status(release ? 204 : 404).end();
  });
  app.use(idem.expressErrorHandler());
  const server = app.listen(0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
}

async function fastify() {
  const Fastify = require('fastify');
  const { Readable } = require('node:stream');
  const app = Fastify({ logger: false });
  // Forms parsed into fields (what @fastify/formbody does), after idem-pg
  // has seen their bytes.
  app.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'string' },
    (request, text, done) => done(null, require('node:querystring').parse(text)));
  await app.register(idem.fastify);
  for (const [path, options, op, where] of routes) {
    app.post(path, { config: { idem: options } }, async (request, reply) => {
      const out = await runOperation(request.idem, op, request, request.body, path, where);
      reply.code(out.status).headers(out.headers || {});
      return out.body;
    });
  }
  app.post('/reports', { config: { idem: { bizType: 'reports.create' } } }, async (request, reply) => {
    await request.idem.query('INSERT INTO orders (route, idem_key, sku, qty) VALUES ($1, $2, $3, $4)', ['/reports', request.idem.key, 'report', 1]);
    reply.code(200).type('text/plain');
    return Readable.from(['line 1\n', 'line 2\n', 'line 3\n']);
  });
  app.post('/test/release/:key', async (request, reply) => {
    const release = holds.get(request.params.key);
    holds.delete(request.params.key);
    if (release) release();
    reply.code(release ? 204 : 404);
    return '';
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  console.log(`listening ${app.server.address().port}`);
}

({ express, fastify })[framework]().catch((err) => {
  console.error(err);
  process.exit(1);
});
