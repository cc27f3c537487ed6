'use strict';
// Drives one framework's test server (server.js) with real HTTP requests
// and checks the outcome in the database: business rows, not claim states.
//   node driver.js express|fastify LABEL
// The server's pool uses SERVER_PGHOST/SERVER_PGPORT (PostgreSQL directly or
// PgBouncer); the checks connect with PGHOST/PGPORT (PostgreSQL directly).
// Every wait is for an observed state (a line from the server, a lock wait
// in pg_stat_activity, a lease that ran out), never for a time.
// Prints "ok ..." / "FAIL ..." lines and "summary [LABEL]: N checks, M failed".
const { spawn } = require('node:child_process');
const http = require('node:http');
const path = require('node:path');
const readline = require('node:readline');
const crypto = require('node:crypto');
const { Client } = require('pg');

const framework = process.argv[2];
const label = process.argv[3] || framework;
const N = Number(process.env.CONCURRENCY || 20);
let checks = 0;
const failed = [];

function expect(what, actual, expected) {
  checks++;
  const a = JSON.stringify(actual), e = JSON.stringify(expected);
  if (a === e) console.log(`ok   ${what}: ${a}`);
  else {
    failed.push(what);
    console.log(`FAIL ${what}: got ${a}, expected ${e}`);
  }
}

const db = new Client();
const q = async (sql, values) => (await db.query(sql, values)).rows;
const count = async (key) => Number((await q('SELECT count(*) AS n FROM orders WHERE idem_key = $1', [key]))[0].n);

// ---- the external provider of the lease test: counts its calls -----------
const providerCalls = new Map();
const provider = http.createServer((req, res) => {
  let data = '';
  req.on('data', (c) => { data += c; });
  req.on('end', () => {
    const { key } = JSON.parse(data);
    const n = (providerCalls.get(key) || 0) + 1;
    providerCalls.set(key, n);
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ charge_id: `ch_${crypto.createHash('sha1').update(key).digest('hex').slice(0, 8)}_${n}` }));
  });
});

// ---- the server under test ---------------------------------------------
let server = null;
function startServer() {
  return new Promise((resolve, reject) => {
    const env = { ...process.env, PGHOST: process.env.SERVER_PGHOST, PGPORT: process.env.SERVER_PGPORT,
      PROVIDER_URL: `http://127.0.0.1:${provider.address().port}` };
    const child = spawn(process.execPath, [path.join(__dirname, 'server.js'), framework], { env, stdio: ['ignore', 'pipe', 'inherit'] });
    const waiters = [];
    const lines = [];
    child.lines = lines;
    child.waitFor = (prefix) => new Promise((res, rej) => {
      const hit = lines.find((l) => l.startsWith(prefix));
      if (hit) res(hit);
      else {
        waiters.push({ prefix, res });
        child.exited.then((how) => rej(new Error(`server exited (${how}) before printing "${prefix}"`)));
      }
    });
    readline.createInterface({ input: child.stdout }).on('line', (line) => {
      lines.push(line);
      for (const w of waiters.splice(0)) {
        if (line.startsWith(w.prefix)) w.res(line);
        else waiters.push(w);
      }
    });
    child.exited = new Promise((res) => child.on('exit', (code, signal) => res(signal || code)));
    child.exited.then((how) => reject(new Error(`server exited (${how}) before listening`)));
    child.waitFor('listening ').then((line) => {
      child.port = Number(line.split(' ')[1]);
      server = child;
      resolve(child);
    });
  });
}
// However the driver ends, its server goes with it.
process.on('exit', () => {
  if (server) server.kill('SIGKILL');
});
async function killServer() {
  server.kill('SIGKILL');
  const how = await server.exited;
  server = null;
  return how;
}

// The server's line for a request that is to stop at a test point; an error
// if that request is answered first (it never reached the point).
function reached(prefix, request) {
  return Promise.race([
    server.waitFor(prefix),
    request.then((r) => { throw new Error(`answered (${r.status || r.error}) before "${prefix}"`); }),
  ]);
}

const newKey = () => `${label}-${crypto.randomUUID()}`;
async function post(route, { key, tenant = 'tenant-a', body, headers = {} }) {
  const h = { 'content-type': 'application/json', 'x-tenant': tenant, ...headers };
  // The draft's field is an sf-string: the key in quotes.
  if (key !== undefined) h['idempotency-key'] = `"${key}"`;
  const r = await fetch(`http://127.0.0.1:${server.port}${route}`, { method: 'POST', headers: h, body: typeof body === 'string' ? body : JSON.stringify(body) });
  const text = await r.text();
  return { status: r.status, headers: Object.fromEntries(r.headers), text };
}
// The key idem claims: "<UTF-8 length of tenant>:<tenant>:<key>".
const scoped = (key, tenant = 'tenant-a') => `${Buffer.byteLength(tenant)}:${tenant}:${key}`;
const release = (key) => fetch(`http://127.0.0.1:${server.port}/test/release/${encodeURIComponent(key)}`, { method: 'POST' });
const tally = (rs) => {
  const t = {};
  for (const r of rs) t[`${r.status}${r.headers['idempotent-replayed'] ? ' replayed' : ''}`] = (t[`${r.status}${r.headers['idempotent-replayed'] ? ' replayed' : ''}`] || 0) + 1;
  return t;
};
// Until `n` sessions wait for a lock in idem_claim (the first request's
// claim), or one of the requests that should be waiting has answered: then
// they are not all waiting, and the checks that follow say what they got.
async function waitForLockWaiters(n, requests) {
  let answered = 0;
  for (const r of requests) r.then(() => { answered++; }, () => { answered++; });
  for (;;) {
    const r = await q(`SELECT count(*) AS n FROM pg_stat_activity
                        WHERE wait_event_type = 'Lock' AND query LIKE '%idem_claim%' AND datname = current_database()`);
    if (Number(r[0].n) >= n || answered > 0) return Number(r[0].n);
    await new Promise((res) => setTimeout(res, 10));
  }
}

// A configuration that chooses no key scope does not start: the process
// exits before it listens, saying why (we wait for it to end, not for a time).
function unscopedRefused() {
  return new Promise((resolve) => {
    const env = { ...process.env, PGHOST: process.env.SERVER_PGHOST, PGPORT: process.env.SERVER_PGPORT, IDEM_TEST_SCOPE: 'none' };
    const child = spawn(process.execPath, [path.join(__dirname, 'server.js'), framework], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (c) => { out += c; });
    child.stderr.on('data', (c) => { out += c; });
    child.on('exit', (code) => resolve({ code, listened: out.includes('listening '), said: out.includes('choose the key scope') }));
  });
}

async function main() {
  await db.connect();
  {
    const r = await unscopedRefused();
    expect('no tenant hook and not singleTenant: refused at start-up, saying why', [r.code !== 0, r.listened, r.said], [true, false, true]);
  }
  await new Promise((res) => provider.listen(0, '127.0.0.1', res));
  await startServer();
  const body = { sku: 'sku-1', qty: 2 };

  // 1. N concurrent identical requests, free-running.
  {
    const key = newKey();
    const rs = await Promise.all(Array.from({ length: N }, () => post('/orders', { key, body })));
    expect(`${N} concurrent identical requests: answers`, { statuses: [...new Set(rs.map((r) => r.status))], bodies: new Set(rs.map((r) => r.text)).size }, { statuses: [201], bodies: 1 });
    expect(`${N} concurrent identical requests: business rows`, await count(scoped(key)), 1);
  }

  // 2. The same, the first held inside its handler until the other N-1 are
  //    seen waiting on its claim (wait: true): all get its answer.
  {
    const key = newKey();
    const first = post('/orders', { key, body, headers: { 'x-test-hold': '1' } });
    await reached(`holding ${scoped(key)}`, first);
    const rest = Array.from({ length: N - 1 }, () => post('/orders', { key, body }));
    const waiting = await waitForLockWaiters(N - 1, rest);
    await release(scoped(key));
    const rs = [await first, ...(await Promise.all(rest))];
    expect(`held first + ${N - 1} duplicates seen waiting (${waiting} lock waits): answers`, { tally: tally(rs), bodies: new Set(rs.map((r) => r.text)).size }, { tally: { 201: 1, '201 replayed': N - 1 }, bodies: 1 });
    expect('held first + waiting duplicates: business rows', await count(scoped(key)), 1);
  }

  // 3. wait: false (and the context through AsyncLocalStorage): 409 + Retry-After while the first runs.
  {
    const key = newKey();
    const first = post('/orders-nowait', { key, body, headers: { 'x-test-hold': '1' } });
    await reached(`holding ${scoped(key)}`, first);
    const rest = await Promise.all(Array.from({ length: N - 1 }, () => post('/orders-nowait', { key, body })));
    expect(`wait: false, ${N - 1} duplicates while the first runs`, { tally: tally(rest), retryAfter: [...new Set(rest.map((r) => r.headers['retry-after']))] }, { tally: { 409: N - 1 }, retryAfter: ['1'] });
    await release(scoped(key));
    const r1 = await first;
    const again = await post('/orders-nowait', { key, body });
    expect('wait: false: the first 201, a later retry replayed with its body', [r1.status, again.status, again.headers['idempotent-replayed'], again.text === r1.text], [201, 201, 'true', true]);
    expect('wait: false: business rows', await count(scoped(key)), 1);
  }

  // 4. The wait is bounded by lock_timeout: when it ends the first is still in progress: 409 + Retry-After.
  {
    const key = newKey();
    const first = post('/orders-short-wait', { key, body, headers: { 'x-test-hold': '1' } });
    await reached(`holding ${scoped(key)}`, first);
    const second = await post('/orders-short-wait', { key, body });
    await release(scoped(key));
    const r1 = await first;
    expect('a duplicate waiting past lockTimeout (100 ms): 409 with Retry-After; the first 201',
      [second.status, second.headers['retry-after'], JSON.parse(second.text).type.endsWith('#request-in-progress'), r1.status], [409, '1', true, 201]);
    expect('lock_timeout: business rows', await count(scoped(key)), 1);
  }

  // 5. Killed after the response was stored, before COMMIT: the retry runs it.
  {
    const key = newKey();
    const first = post('/orders', { key, body, headers: { 'x-test-pause': 'before-commit' } }).catch((e) => ({ error: e.cause ? e.cause.code || e.message : e.message }));
    await reached(`paused before-commit ${scoped(key)}`, first);
    const how = await killServer();
    const lost = await first;
    await startServer();
    const retry = await post('/orders', { key, body });
    const again = await post('/orders', { key, body });
    expect('killed before COMMIT: the first request got no answer', [how, Boolean(lost.error)], ['SIGKILL', true]);
    expect('killed before COMMIT: the retry ran (201, not replayed), the next one replays it',
      [retry.status, retry.headers['idempotent-replayed'] || null, again.status, again.headers['idempotent-replayed'], again.text === retry.text], [201, null, 201, 'true', true]);
    expect('killed before COMMIT: business rows', await count(scoped(key)), 1);
  }

  // 6. Killed after COMMIT, before the answer went out: the retry is replayed.
  {
    const key = newKey();
    const first = post('/orders', { key, body, headers: { 'x-test-pause': 'after-commit' } }).catch((e) => ({ error: e.message }));
    await reached(`paused after-commit ${scoped(key)}`, first);
    await killServer();
    const lost = await first;
    await startServer();
    const retry = await post('/orders', { key, body });
    const row = (await q('SELECT id FROM orders WHERE idem_key = $1', [scoped(key)]))[0];
    expect('killed after COMMIT: no answer, then the retry replays the committed one',
      [Boolean(lost.error), retry.status, retry.headers['idempotent-replayed'], JSON.parse(retry.text).order_id === Number(row && row.id), retry.headers.location === `/orders/${row && row.id}`],
      [true, 201, 'true', true, true]);
    expect('killed after COMMIT: business rows', await count(scoped(key)), 1);
  }

  // 7. The same key with another body: 422, nothing written; the first stays.
  {
    const key = newKey();
    const r1 = await post('/orders', { key, body });
    const reordered = await post('/orders', { key, body: '{ "qty": 2,   "sku": "sku-1" }' });
    const changed = await post('/orders', { key, body: { sku: 'sku-1', qty: 3 } });
    expect('same key, body re-serialised (key order, spaces): replayed', [r1.status, reordered.status, reordered.headers['idempotent-replayed']], [201, 201, 'true']);
    expect('same key, changed body: 422 problem, business rows unchanged', [changed.status, changed.headers['content-type'], await count(scoped(key))], [422, 'application/problem+json', 1]);
  }

  // 8. No key: 400 and nothing runs; a route where the key is optional runs.
  {
    const before = Number((await q('SELECT count(*) AS n FROM orders'))[0].n);
    const missing = await post('/orders', { body });
    const bad = await post('/orders', { key: 'short', body });
    const after = Number((await q('SELECT count(*) AS n FROM orders'))[0].n);
    expect('missing key / too short a key: 400, nothing written', [missing.status, bad.status, after - before], [400, 400, 0]);
    const optional = await post('/orders-optional', { body });
    expect('optional key, none sent: the handler runs (201), one row', [optional.status, Number((await q("SELECT count(*) AS n FROM orders WHERE route = '/orders-optional' AND idem_key IS NULL"))[0].n) >= 1], [201, true]);
  }

  // 9. Tenants: the same key string from two tenants is two operations.
  {
    const key = newKey();
    const a = await post('/orders', { key, body, tenant: 'tenant-a' });
    const b = await post('/orders', { key, body, tenant: 'tenant-b' });
    expect('one key from two tenants: two operations', [a.status, b.status, b.headers['idempotent-replayed'] || null, await count(scoped(key, 'tenant-a')), await count(scoped(key, 'tenant-b'))], [201, 201, null, 1, 1]);
  }

  // 10. A handler exception: 500, nothing stored or written; the retry runs.
  {
    const key = newKey();
    const r1 = await post('/orders', { key, body, headers: { 'x-test-throw': '1' } });
    const state = (await q('SELECT state FROM idem_lookup($1, $2)', [scoped(key), 'orders.create']))[0].state;
    const rows = await count(scoped(key));
    const retry = await post('/orders', { key, body });
    expect('handler exception: 500, claim absent, no row; the retry runs (201, not replayed), one row',
      [r1.status, state, rows, retry.status, retry.headers['idempotent-replayed'] || null, await count(scoped(key))], [500, 'absent', 0, 201, null, 1]);
  }

  // 11. A transient SQLSTATE in the handler: 503 + Retry-After, rolled back; the retry runs.
  for (const code of ['40001', '40P01']) {
    const key = newKey();
    const r1 = await post('/orders', { key, body, headers: { 'x-test-sqlstate': code } });
    const state = (await q('SELECT state FROM idem_lookup($1, $2)', [scoped(key), 'orders.create']))[0].state;
    const rows = await count(scoped(key));
    const retry = await post('/orders', { key, body });
    expect(`SQLSTATE ${code} in the handler: 503 + Retry-After, claim absent, no row; the retry runs`,
      [r1.status, r1.headers['retry-after'], state, rows, retry.status, retry.headers['idempotent-replayed'] || null, await count(scoped(key))], [503, '1', 'absent', 0, 201, null, 1]);
  }

  // 11b. The connection lost in the handler: 503, rolled back; the retry runs.
  {
    const key = newKey();
    const r1 = await post('/orders', { key, body, headers: { 'x-test-terminate': '1' } });
    const state = (await q('SELECT state FROM idem_lookup($1, $2)', [scoped(key), 'orders.create']))[0].state;
    const rows = await count(scoped(key));
    const retry = await post('/orders', { key, body });
    expect('connection lost in the handler: 503 + Retry-After, claim absent, no row; the retry runs',
      [r1.status, r1.headers['retry-after'], state, rows, retry.status, retry.headers['idempotent-replayed'] || null, await count(scoped(key))], [503, '1', 'absent', 0, 201, null, 1]);
  }

  // 12. A stored business failure (422) is replayed, and nothing was written.
  {
    const key = newKey();
    const oos = { sku: 'out-of-stock', qty: 1 };
    const r1 = await post('/orders', { key, body: oos });
    const r2 = await post('/orders', { key, body: oos });
    const state = (await q('SELECT state FROM idem_lookup($1, $2)', [scoped(key), 'orders.create']))[0].state;
    expect('business failure 422: stored as failed, replayed byte for byte, no row',
      [r1.status, r2.status, r2.headers['idempotent-replayed'], r2.text === r1.text, state, await count(scoped(key))], [422, 422, 'true', true, 'failed', 0]);
  }

  // 13. A streamed answer: passed through; stored without its body.
  {
    const key = newKey();
    const r1 = await post('/reports', { key, body });
    const r2 = await post('/reports', { key, body });
    expect('streamed response: sent whole, the retry replays status and headers without the body, one row',
      [r1.status, r1.text, r2.status, r2.headers['idempotent-replayed'], r2.headers['idempotent-body-omitted'], r2.text, await count(scoped(key))],
      [200, 'line 1\nline 2\nline 3\n', 200, 'true', 'true', '', 1]);
  }

  // 14. Lease mode: the provider is called, the recovery point recorded, the
  //     process killed; a retry during the lease gets 409; once the lease has
  //     run out, the retry takes over and resumes from the recovery point.
  {
    const key = newKey();
    const charge = { amount: 4200 };
    const first = post('/charges', { key, body: charge, headers: { 'x-test-pause': 'after-checkpoint' } }).catch((e) => ({ error: e.message }));
    await reached(`paused after-checkpoint ${scoped(key)}`, first);
    // The lease (2 s, renewed by the checkpoint) is running: a duplicate gets 409.
    const during = await post('/charges', { key, body: charge });
    const lease = (await q('SELECT state FROM idem_lookup($1, $2)', [scoped(key), 'charges.create']))[0];
    await killServer();
    await first;
    await startServer();
    for (;;) {
      const r = await q('SELECT ran_out FROM idem_leases WHERE key = $1 AND biz_type = $2', [scoped(key), 'charges.create']);
      if (r.length === 0 || r[0].ran_out) break;
      await new Promise((res) => setTimeout(res, 50));
    }
    const after = await post('/charges', { key, body: charge });
    const replayed = await post('/charges', { key, body: charge });
    const rows = (await q('SELECT charge_id FROM charges WHERE idem_key = $1', [scoped(key)])).map((r) => r.charge_id);
    const b = JSON.parse(after.text);
    expect('lease: state during the lease, a retry then: 409 with retryAfter of the route (2, set to the lease)', [lease.state, during.status, during.headers['retry-after']], ['in_progress', 409, '2']);
    expect('lease: after it ran out the retry takes over (attempt 2), resumes, provider called once, one row',
      [after.status, b.attempt, providerCalls.get(scoped(key)), rows.length, rows[0] === b.charge_id, replayed.status, replayed.headers['idempotent-replayed']],
      [201, 2, 1, 1, true, 201, 'true']);
  }

  // 15. The conformance table (tests/middleware/conformance.json).
  await require('./conformance').run(`http://127.0.0.1:${server.port}`, (ok, what) => {
    checks++;
    if (ok) console.log(`ok   ${what}`);
    else {
      failed.push(what);
      console.log(`FAIL ${what}`);
    }
  });

  await killServer();
  provider.close();
  await db.end();
  console.log(`summary [${label}]: ${checks} checks, ${failed.length} failed`);
  process.exit(failed.length ? 1 : 0);
}

main().catch((err) => {
  console.log(`FAIL ${label}: ${err.stack || err}`);
  if (server) server.kill('SIGKILL');
  process.exit(1);
});
