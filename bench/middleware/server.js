// The Node side of bench/middleware.sh: Express 5, one handler (insert a
// business row, answer 201) behind POST /mw (idem-pg's middleware: variants a
// and b), /hand (hand-written dedup in one transaction: c) and /plain (none:
// d), on one pg.Pool of BENCH_POOL connections.
//   node server.js PORT      (PGHOST, PGPORT, PGUSER, PGDATABASE, BENCH_POOL)
'use strict';
const express = require('express');
const { Pool } = require('pg');
const { createIdem } = require('idem-pg');

const port = Number(process.argv[2]);
const size = Number(process.env.BENCH_POOL || 8);
const pool = new Pool({ max: size, min: size });
const idem = createIdem({ pool, singleTenant: true, prepare: process.env.BENCH_PREPARE === '1' });
const app = express();
app.use(express.json({ verify: idem.rawBody }));

// The business work, the same in every variant.
async function createOrder(client, key, body) {
  const { rows } = await client.query('INSERT INTO orders (key, amount) VALUES ($1, $2) RETURNING id', [key, body.amount]);
  return { id: Number(rows[0].id), amount: body.amount };
}

app.post('/mw', idem.express({ bizType: 'bench.mw' }), async (req, res) => {
  res.status(201).json(await createOrder(req.idem.client, req.get('idempotency-key'), req.body));
});

app.post('/hand', async (req, res) => {
  const key = req.get('idempotency-key');
  if (!key) return res.status(400).json({ error: 'Idempotency-Key required' });
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const claimed = await client.query('INSERT INTO dedup (key) VALUES ($1) ON CONFLICT DO NOTHING RETURNING key', [key]);
    if (claimed.rowCount === 0) {
      // A duplicate: the stored answer (a concurrent first request's
      // transaction is waited for through the primary key's lock).
      const stored = await client.query('SELECT response FROM dedup WHERE key = $1', [key]);
      await client.query('COMMIT');
      return res.status(201).json(stored.rows[0].response);
    }
    const result = await createOrder(client, key, req.body);
    await client.query('UPDATE dedup SET response = $1::jsonb WHERE key = $2', [JSON.stringify(result), key]);
    await client.query('COMMIT');
    res.status(201).json(result);
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    client.release();
  }
});

app.post('/plain', async (req, res) => {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const result = await createOrder(client, req.get('idempotency-key') || null, req.body);
    await client.query('COMMIT');
    res.status(201).json(result);
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    client.release();
  }
});

app.use(idem.expressErrorHandler());

// A normal exit on a signal, so that node --cpu-prof writes its profile.
for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => process.exit(0));

// Open every pool connection before announcing readiness, so no variant
// pays the connections' start.
Promise.all(Array.from({ length: size }, () => pool.connect()))
  .then((clients) => { clients.forEach((c) => c.release()); })
  .then(() => app.listen(port, '127.0.0.1', () => console.log(`listening on 127.0.0.1:${port}`)));
