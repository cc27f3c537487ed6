'use strict';
// A complete Fastify app with idem-pg, run as it is by
// tests/scenarios/clients.sh middleware_node (clients/node/test/examples.js):
//
//   PGHOST=/var/run/postgresql PGDATABASE=shop PORT=3000 \
//   API_TOKENS='{"secret-acme":"acme"}' node fastify-app.js
//
// The order of the layers is the point: idem-pg claims in a preHandler that
// it appends to each idem route, so authentication and rate limiting go in
// onRequest hooks, which Fastify runs before every preHandler. A 401 or 429
// answered there never claims the key; the retry runs.
const Fastify = require('fastify');
const { Pool } = require('pg');
const { createIdem } = require('idem-pg');

// One connection per request in flight, plus the duplicates that wait for
// the first request's transaction (up to lockTimeout, 5 s by default).
const pool = new Pool({ max: Number(process.env.POOL_MAX || 20) });
pool.on('error', () => {}); // an idle connection lost: the pool replaces it

const tokens = JSON.parse(process.env.API_TOKENS || '{}'); // bearer token -> tenant
const idem = createIdem({
  pool,
  // The key's scope: the authenticated tenant (the onRequest hook ran before).
  tenant: (request) => request.tenant || null,
});

const limit = Number(process.env.RATE_LIMIT || 100); // per tenant per window
const windowMs = Number(process.env.RATE_WINDOW_MS || 60000);
const windows = new Map();

async function main() {
  const app = Fastify();
  app.decorateRequest('tenant', null);
  app.addHook('onRequest', async (request, reply) => {
    const m = /^Bearer (\S+)$/.exec(request.headers.authorization || '');
    const tenant = m ? tokens[m[1]] : undefined;
    if (!tenant) return reply.code(401).header('www-authenticate', 'Bearer').send({ error: 'unauthorized' });
    request.tenant = tenant;
    const now = Date.now();
    let w = windows.get(tenant);
    if (!w || now >= w.until) windows.set(tenant, (w = { until: now + windowMs, used: 0 }));
    w.used += 1;
    if (w.used > limit) return reply.code(429).header('retry-after', String(Math.ceil((w.until - now) / 1000))).send({ error: 'rate limited' });
    return undefined;
  });
  await app.register(idem.fastify);
  app.post('/orders', { config: { idem: { bizType: 'orders.create' } } }, async (request, reply) => {
    // request.idem.query: the connection whose transaction holds the claim.
    const { rows } = await request.idem.query(
      'INSERT INTO example_orders (tenant, idem_key, sku, qty) VALUES ($1, $2, $3, $4) RETURNING id',
      [request.tenant, request.idem.key, request.body.sku, request.body.qty]);
    reply.code(201).header('location', `/orders/${rows[0].id}`);
    return { id: Number(rows[0].id), sku: request.body.sku, qty: request.body.qty };
  });
  await pool.query(`CREATE TABLE IF NOT EXISTS example_orders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant text NOT NULL, idem_key text NOT NULL,
    sku text NOT NULL, qty int NOT NULL)`);
  await app.listen({ port: Number(process.env.PORT || 3000), host: '127.0.0.1' });
  console.log(`listening ${app.server.address().port}`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
