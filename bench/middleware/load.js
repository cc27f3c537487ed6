// The load client of bench/middleware.sh, the same for every variant and
// both servers: CONCURRENCY keep-alive connections on loopback, each a loop
// that sends its next POST as soon as the previous answer arrived, until
// REQUESTS requests were answered. Node's own http module (no dependency).
//
//   node load.js URL REQUESTS CONCURRENCY KEYS [SAVE]
//
// KEYS: "fresh" sends a new random UUID per request (as clients make
// idempotency keys: spread over the key index, not appended at its right
// edge) and, with SAVE, writes the keys it sent to that file; "file:PATH" replays the keys of PATH
// (one request per key, in order); "none" sends no Idempotency-Key.
// Prints one JSON line: requests, seconds, rps, p50/p99 latency (µs), the
// client's own CPU seconds during the run, status counts, replayed (answers with Idempotent-Replayed: true).
// Exits 1 when an answer is not a 201 (or, for a replay, not replayed).
'use strict';
const http = require('node:http');
const fs = require('node:fs');
const crypto = require('node:crypto');

const [url, requestsArg, concurrencyArg, keys, save] = process.argv.slice(2);
const target = new URL(url);
const concurrency = Number(concurrencyArg);
let keyOf;
let total = Number(requestsArg);
const replaying = keys.startsWith('file:');
if (keys === 'fresh') {
  keyOf = () => crypto.randomUUID();
} else if (replaying) {
  const list = fs.readFileSync(keys.slice('file:'.length), 'utf8').split('\n').filter(Boolean);
  total = Math.min(total, list.length);
  keyOf = (i) => list[i];
} else if (keys === 'none') {
  keyOf = () => null;
} else {
  throw new Error(`KEYS: ${keys}`);
}

const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
const body = JSON.stringify({ amount: 42 });
const statuses = {};
const latencies = new Float64Array(total);
const sent = [];
let next = 0;
let replayed = 0;
let bad = 0;
let firstBad = null;

function post(key) {
  return new Promise((resolve, reject) => {
    const headers = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) };
    if (key !== null) headers['idempotency-key'] = `"${key}"`; // an sf-string, as the draft says
    if (process.env.BENCH_TENANT) headers['x-tenant'] = process.env.BENCH_TENANT; // the Java server's scope
    const req = http.request({ agent, host: target.hostname, port: target.port, path: target.pathname, method: 'POST', headers }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, replayed: res.headers['idempotent-replayed'] === 'true', body: Buffer.concat(chunks).toString() }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

async function worker() {
  for (;;) {
    const i = next++;
    if (i >= total) return;
    const key = keyOf(i);
    const t0 = process.hrtime.bigint();
    const r = await post(key);
    latencies[i] = Number(process.hrtime.bigint() - t0) / 1000;
    statuses[r.status] = (statuses[r.status] || 0) + 1;
    if (r.replayed) replayed++;
    if (r.status !== 201 || r.replayed !== replaying) {
      bad++;
      if (firstBad === null) firstBad = `${r.status} replayed=${r.replayed} ${r.body.slice(0, 200)}`;
    }
    if (key !== null) sent.push(key);
  }
}

(async () => {
  const t0 = process.hrtime.bigint();
  const cpu0 = process.cpuUsage();
  await Promise.all(Array.from({ length: concurrency }, worker));
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  agent.destroy();
  const sorted = Array.from(latencies).sort((a, b) => a - b);
  const rank = (q) => sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];
  if (save) fs.writeFileSync(save, sent.join('\n') + '\n');
  console.log(JSON.stringify({
    requests: total, seconds, rps: total / seconds,
    p50_us: Math.round(rank(0.5)), p99_us: Math.round(rank(0.99)),
    client_cpu_s: (cpu.user + cpu.system) / 1e6,
    statuses, replayed, bad, first_bad: firstBad,
  }));
  process.exit(bad ? 1 : 0);
})().catch((err) => { console.error(err); process.exit(2); });
