'use strict';
// Runs the README's example app (clients/node/examples/<framework>-app.js,
// copied as it is next to this file) on loopback and checks what a newcomer
// relies on, with real HTTP requests and the business rows:
//   * without credentials: 401 from the authentication layer; the retry with
//     a token runs the work (one row), the next is replayed;
//   * tenants whose spellings collide under a bare separator (acme + "eu:K",
//     "acme:eu" + "K") each get their own operation and row;
//   * the rate limiter's 429 for a key: once the limit allows it, the retry
//     with that key runs the work (it was not stored).
//   node examples.js express|fastify
// Every wait is for an observed state (a line from the app, an answer other
// than 429), never a verdict by the clock.
const { spawn } = require('node:child_process');
const path = require('node:path');
const readline = require('node:readline');
const crypto = require('node:crypto');
const { Client } = require('pg');

const framework = process.argv[2];
let checks = 0;
const failed = [];
function expect(what, actual, wanted) {
  checks++;
  const a = JSON.stringify(actual), e = JSON.stringify(wanted);
  if (a === e) console.log(`ok   [${framework} example] ${what}: ${a}`);
  else {
    failed.push(what);
    console.log(`FAIL [${framework} example] ${what}: got ${a}, expected ${e}`);
  }
}

const tokens = { 'token-acme': 'acme', 'token-acme-eu': 'acme:eu', 'token-rl': 'limited' };
const scoped = (tenant, key) => `${Buffer.byteLength(tenant)}:${tenant}:${key}`;

async function main() {
  const db = new Client();
  await db.connect();
  const child = spawn(process.execPath, [path.join(__dirname, `${framework}-app.js`)], {
    env: { ...process.env, PORT: '0', API_TOKENS: JSON.stringify(tokens), RATE_LIMIT: '5', RATE_WINDOW_MS: '2000' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  process.on('exit', () => child.kill('SIGKILL'));
  const port = await new Promise((resolve, reject) => {
    readline.createInterface({ input: child.stdout }).on('line', (l) => {
      if (l.startsWith('listening ')) resolve(Number(l.split(' ')[1]));
    });
    child.on('exit', (code) => reject(new Error(`the example exited (${code}) before listening`)));
  });
  const post = async (key, token, body = { sku: 'sku-1', qty: 1 }) => {
    const headers = { 'content-type': 'application/json', 'idempotency-key': `"${key}"` };
    if (token) headers.authorization = `Bearer ${token}`;
    const r = await fetch(`http://127.0.0.1:${port}/orders`, { method: 'POST', headers, body: JSON.stringify(body) });
    return { status: r.status, replayed: r.headers.get('idempotent-replayed') === 'true', text: await r.text() };
  };
  const rows = async (tenant, key) => Number((await db.query('SELECT count(*) AS n FROM example_orders WHERE idem_key = $1',
    [scoped(tenant, key)])).rows[0].n);
  const run = crypto.randomUUID();

  {
    const key = `${run}-auth`;
    const denied = await post(key, null);
    const bad = await post(key, 'not-a-token');
    const ok = await post(key, 'token-acme');
    const again = await post(key, 'token-acme');
    expect('401 without credentials, then the retry with a token runs, the next is replayed, one row',
      [denied.status, bad.status, ok.status, ok.replayed, again.status, again.replayed, again.text === ok.text, await rows('acme', key)],
      [401, 401, 201, false, 201, true, true, 1]);
  }
  {
    const k = `${run}-K`;
    const a = await post(k, 'token-acme');
    const b = await post(`eu:${k}`, 'token-acme');
    const c = await post(k, 'token-acme-eu');
    const ids = new Set([a, b, c].map((r) => r.text));
    expect('acme + "eu:K" and "acme:eu" + "K": each its own operation and row',
      [a.status, b.status, c.status, b.replayed || c.replayed, ids.size, await rows('acme', k), await rows('acme', `eu:${k}`), await rows('acme:eu', k)],
      [201, 201, 201, false, 3, 1, 1, 1]);
  }
  {
    // Spend the limit with fresh keys until the limiter answers 429 (a
    // bound of 50 requests guards against a hang, not a verdict).
    let limited = null;
    for (let i = 0; i < 50 && !limited; i++) {
      const key = `${run}-rl-${i}`;
      const r = await post(key, 'token-rl');
      if (r.status === 429) limited = key;
    }
    let retry = null;
    if (limited) {
      for (let i = 0; i < 600; i++) {
        retry = await post(limited, 'token-rl');
        if (retry.status !== 429) break;
        await new Promise((res) => setTimeout(res, 100));
      }
    }
    const again = limited ? await post(limited, 'token-rl') : null;
    expect('a key refused 429 by the rate limiter: the retry the limit lets through runs the work, then is replayed',
      [limited !== null, retry && retry.status, retry && retry.replayed, again && again.replayed, limited && await rows('limited', limited)],
      [true, 201, false, true, 1]);
  }
  child.kill('SIGKILL');
  await db.end();
  console.log(`summary [${framework} example]: ${checks} checks, ${failed.length} failed`);
  process.exit(failed.length ? 1 : 0);
}

main().catch((err) => {
  console.log(`FAIL [${framework} example]: ${err.stack || err}`);
  process.exit(1);
});
