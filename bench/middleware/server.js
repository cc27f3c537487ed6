// The Node side of bench/middleware.sh: Express 5 or Fastify 5, one handler
// (insert a business row, answer 201) behind POST /mw (idem-pg's middleware:
// variants a and b), /hand (hand-written dedup in one transaction: c) and
// /plain (none: d), on one pg.Pool of BENCH_POOL connections.
//   node server.js PORT [express|fastify]   (PGHOST, PGPORT, PGUSER, PGDATABASE, BENCH_POOL)
'use strict';
const express = require('express');
const Fastify = require('fastify');
const { Pool } = require('pg');
const { createIdem } = require('idem-pg');

const port = Number(process.argv[2]);
const framework = process.argv[3] || 'express';
const size = Number(process.env.BENCH_POOL || 8);
const pool = new Pool({ max: size, min: size });
const idem = createIdem({ pool, singleTenant: true, prepare: process.env.BENCH_PREPARE === '1' });

// The business work, the same in every variant.
async function createOrder(client, key, body) {
  const { rows } = await client.query('INSERT INTO orders (key, amount) VALUES ($1, $2) RETURNING id', [key, body.amount]);
  return { id: Number(rows[0].id), amount: body.amount };
}

// c and d, the same for both frameworks: [status, body].
async function inTransaction(work) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const out = await work(client);
    await client.query('COMMIT');
    return out;
  } catch (err) { await client.query('ROLLBACK').catch(() => {}); throw err; } finally { client.release(); }
}
async function hand(key, body) {
  if (!key) return [400, { error: 'Idempotency-Key required' }];
  return inTransaction(async (client) => {
    const claimed = await client.query('INSERT INTO dedup (key) VALUES ($1) ON CONFLICT DO NOTHING RETURNING key', [key]);
    // A duplicate: the stored answer (a concurrent first request's
    // transaction is waited for through the primary key's lock).
    if (claimed.rowCount === 0) return [201, (await client.query('SELECT response FROM dedup WHERE key = $1', [key])).rows[0].response];
    const result = await createOrder(client, key, body);
    await client.query('UPDATE dedup SET response = $1::jsonb WHERE key = $2', [JSON.stringify(result), key]);
    return [201, result];
  });
}
const plain = (key, body) => inTransaction(async (client) => [201, await createOrder(client, key || null, body)]);

async function listen() {
  if (framework === 'fastify') {
    const app = Fastify();
    await app.register(idem.fastify);
    app.post('/mw', { config: { idem: { bizType: 'bench.mw' } } }, async (request, reply) =>
      reply.code(201).send(await createOrder({ query: request.idem.query }, request.headers['idempotency-key'], request.body)));
    for (const [path, fn] of [['/hand', hand], ['/plain', plain]]) {
      app.post(path, async (request, reply) => {
        const [status, body] = await fn(request.headers['idempotency-key'], request.body);
        return reply.code(status).send(body);
      });
    }
    return app.listen({ port, host: '127.0.0.1' });
  }
  const app = express();
  app.use(express.json({ verify: idem.rawBody }));
  app.post('/mw', idem.express({ bizType: 'bench.mw' }), async (req, res) => {
    res.status(201).json(await createOrder(req.idem.client, req.get('idempotency-key'), req.body));
  });
  for (const [path, fn] of [['/hand', hand], ['/plain', plain]]) {
    app.post(path, async (req, res) => {
      const [status, body] = await fn(req.get('idempotency-key'), req.body);
      res.status(status).json(body);
    });
  }
  app.use(idem.expressErrorHandler());
  return new Promise((resolve) => app.listen(port, '127.0.0.1', resolve));
}

// A normal exit on a signal, so that node --cpu-prof writes its profile.
for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => process.exit(0));

// Open every pool connection before announcing readiness, so no variant
// pays the connections' start.
Promise.all(Array.from({ length: size }, () => pool.connect()))
  .then((clients) => { clients.forEach((c) => c.release()); })
  .then(listen)
  .then(() => console.log(`${framework} listening on 127.0.0.1:${port}`));
