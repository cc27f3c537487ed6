// node-postgres behind PgBouncer in transaction mode, for
// tests/scenarios/clients.sh pgbouncer: two clients on one server session
// (pool_size 1). A query given a `name` is a named prepared statement,
// parsed once per connection and bound by name afterwards; without a name,
// each query is an unnamed statement sent whole (Parse, Bind, Execute, Sync).
// Connection from PGHOST, PGPORT, PGUSER, PGDATABASE. Prints, per client and
// kind, the SQLSTATEs of 3 runs.
const { Client } = require('pg');

async function runs(db, query, n) {
  const states = [];
  for (let i = 0; i < n; i++) {
    try {
      await db.query({ ...query, values: [String(i)] });
      states.push('00000');
    } catch (e) {
      states.push(e.code || 'error');
    }
  }
  return states.join(',');
}

(async () => {
  const a = new Client(), b = new Client();
  await a.connect();
  await b.connect();
  const pid = async (db) => (await db.query('SELECT pg_backend_pid() AS p')).rows[0].p;
  console.log(`pids ${await pid(a)} ${await pid(b)}`);
  console.log(`unnamed A ${await runs(a, { text: "SELECT 'statement of client A: ' || $1::text" }, 3)}`);
  console.log(`unnamed B ${await runs(b, { text: "SELECT 'statement of client B: ' || $1::text" }, 3)}`);
  console.log(`named A ${await runs(a, { name: 'lookup', text: "SELECT 'statement of client A: ' || $1::text" }, 3)}`);
  console.log(`named B ${await runs(b, { name: 'lookup', text: "SELECT 'statement of client B: ' || $1::text" }, 3)}`);
  await a.end();
  await b.end();
})().catch((e) => { console.error(e); process.exit(1); });
