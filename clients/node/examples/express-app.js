'use strict';
// A complete Express app with idem-pg, run as it is by
// tests/scenarios/clients.sh middleware_node (clients/node/test/examples.js):
//
//   PGHOST=/var/run/postgresql PGDATABASE=shop PORT=3000 \
//   API_TOKENS='{"secret-acme":"acme"}' node express-app.js
//
// The order of the layers is the point: authentication first (the tenant
// hook reads what it found), then rate limiting, then the idempotency
// middleware, then the handler. A 401 or 429 answered before idem never
// claims the key; the retry with credentials, or after the limit, runs.
const express = require('express');
const { Pool } = require('pg');
const { createIdem } = require('idem-pg');

// One connection per request in flight, plus the duplicates that wait for
// the first request's transaction (up to lockTimeout, 5 s by default).
const pool = new Pool({ max: Number(process.env.POOL_MAX || 20) });
pool.on('error', () => {}); // an idle connection lost: the pool replaces it

const tokens = JSON.parse(process.env.API_TOKENS || '{}'); // bearer token -> tenant
const idem = createIdem({
  pool,
  // The key's scope: the authenticated tenant (authenticate() ran before).
  tenant: (req) => req.tenant || null,
});

function authenticate(req, res, next) {
  const m = /^Bearer (\S+)$/.exec(req.get('authorization') || '');
  const tenant = m ? tokens[m[1]] : undefined;
  if (!tenant) return res.status(401).set('www-authenticate', 'Bearer').json({ error: 'unauthorized' });
  req.tenant = tenant;
  return next();
}

// At most RATE_LIMIT requests per tenant per RATE_WINDOW_MS (fixed window).
const limit = Number(process.env.RATE_LIMIT || 100);
const windowMs = Number(process.env.RATE_WINDOW_MS || 60000);
const windows = new Map();
function rateLimit(req, res, next) {
  const now = Date.now();
  let w = windows.get(req.tenant);
  if (!w || now >= w.until) windows.set(req.tenant, (w = { until: now + windowMs, used: 0 }));
  w.used += 1;
  if (w.used > limit) {
    return res.status(429).set('retry-after', String(Math.ceil((w.until - now) / 1000))).json({ error: 'rate limited' });
  }
  return next();
}

const app = express();
app.use(express.json({ verify: idem.rawBody })); // keeps the bytes the fingerprint counts
app.post('/orders', authenticate, rateLimit, idem.express({ bizType: 'orders.create' }), async (req, res) => {
  // req.idem.query: the connection whose transaction holds the claim.
  const { rows } = await req.idem.query(
    'INSERT INTO example_orders (tenant, idem_key, sku, qty) VALUES ($1, $2, $3, $4) RETURNING id',
    [req.tenant, req.idem.key, req.body.sku, req.body.qty]);
  res.status(201).location(`/orders/${rows[0].id}`).json({ id: Number(rows[0].id), sku: req.body.sku, qty: req.body.qty });
});
app.use(idem.expressErrorHandler()); // transient database errors: 503 + Retry-After

pool.query(`CREATE TABLE IF NOT EXISTS example_orders (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant text NOT NULL, idem_key text NOT NULL,
  sku text NOT NULL, qty int NOT NULL)`).then(() => {
  const server = app.listen(Number(process.env.PORT || 3000), '127.0.0.1', () => console.log(`listening ${server.address().port}`));
});
