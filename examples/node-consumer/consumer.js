// An order-event consumer that applies each event at most once and in the
// order the business allows, whatever order and however often the broker
// delivers it.
//
// The "broker" is a log file (one JSON event per line; the line number is
// the offset) and a committed-offset file, as a Kafka partition and its
// consumer group's committed offset: the consumer commits its offset after
// its database transaction, so a crash between the two redelivers events
// that were already applied. Every event is handled in one transaction:
//
//   CREATED            INSERT the order (ON CONFLICT DO NOTHING: a duplicate creates nothing)
//   PAID, SHIPPED ...  idem_transition('orders', 'id', order, 'status', type, 'order')
//                        applied   -> do the side effect (an outbox row, same transaction)
//                        already   -> a duplicate or a redelivery: drop it
//                        stale     -> an old event overtaken by a later state: drop it
//                        premature -> ahead of the order's state: park it, retry after the next
//                                     applied event; the offset is not committed past it
//
// Usage: node consumer.js --topic events.jsonl --offsets FILE [--crash-after OFFSET]
// --crash-after kills the process (SIGKILL) right after the database
// transaction of that offset committed, before the offset is committed.
// Connection: the libpq environment variables PGHOST, PGPORT, PGUSER, PGDATABASE.
'use strict';

const fs = require('fs');
const { Client } = require('pg');

const MACHINE = { CREATED: ['PAID', 'CANCELLED'], PAID: ['SHIPPED', 'REFUNDED'], SHIPPED: ['DONE'] };
// What the business does once per applied state change.
const EFFECT = { CREATED: 'reserve_stock', PAID: 'send_receipt', SHIPPED: 'notify_customer' };

function args() {
  const a = process.argv.slice(2);
  const get = (name, dflt) => (a.includes(name) ? a[a.indexOf(name) + 1] : dflt);
  const o = { topic: get('--topic'), offsets: get('--offsets'), crashAfter: get('--crash-after') };
  if (!o.topic || !o.offsets) {
    console.error('usage: node consumer.js --topic FILE --offsets FILE [--crash-after OFFSET]');
    process.exit(2);
  }
  o.crashAfter = o.crashAfter === undefined ? -1 : Number(o.crashAfter);
  return o;
}

function readCommitted(file) {
  try { return JSON.parse(fs.readFileSync(file, 'utf8')).committed; } catch (e) { return 0; }
}

function commitOffset(file, committed) {
  // Write and rename: a crash leaves the old offset or the new one, never half a file.
  fs.writeFileSync(file + '.tmp', JSON.stringify({ committed }) + '\n');
  fs.renameSync(file + '.tmp', file);
}

async function setup(db) {
  await db.query(`CREATE EXTENSION IF NOT EXISTS idem;
    CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, status text NOT NULL, amount numeric(12,2));
    CREATE TABLE IF NOT EXISTS outbox (
      id bigserial PRIMARY KEY, order_id text NOT NULL, effect text NOT NULL,
      event_id text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`);
  // Redefining the same machine is harmless, so every start does it.
  await db.query('SELECT idem_define_machine($1, $2)', ['order', JSON.stringify(MACHINE)]);
}

// One event, one transaction. Returns the verdict.
async function handle(db, ev) {
  await db.query('BEGIN');
  try {
    let verdict;
    if (ev.type === 'CREATED') {
      const r = await db.query(
        "INSERT INTO orders (id, status, amount) VALUES ($1, 'CREATED', $2) ON CONFLICT (id) DO NOTHING",
        [ev.order, ev.amount]);
      verdict = r.rowCount === 1 ? 'applied' : 'already';
    } else {
      try {
        const r = await db.query(
          "SELECT idem_transition('orders', 'id', $1, 'status', $2, 'order') AS verdict", [ev.order, ev.type]);
        verdict = r.rows[0].verdict;
      } catch (e) {
        // P0002: the order's CREATED event has not arrived yet; the event is
        // early, exactly like a state that is more than one step ahead.
        if (e.code !== 'P0002') throw e;
        await db.query('ROLLBACK');
        return 'premature';
      }
    }
    if (verdict === 'applied') {
      await db.query('INSERT INTO outbox (order_id, effect, event_id) VALUES ($1, $2, $3)',
        [ev.order, EFFECT[ev.type], ev.event_id]);
    }
    await db.query('COMMIT');
    return verdict;
  } catch (e) {
    await db.query('ROLLBACK').catch(() => {});
    throw e;
  }
}

const MEANING = {
  applied: (ev) => `applied, ${EFFECT[ev.type]} once`,
  already: () => 'already applied: dropped (duplicate)',
  stale: () => 'stale (the order is past it): dropped',
  premature: () => 'premature: parked, retried after the next applied event',
};

async function main() {
  const o = args();
  const events = fs.readFileSync(o.topic, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
  const db = new Client({ application_name: 'idem-example-consumer' });
  await db.connect();
  await setup(db);

  let next = readCommitted(o.offsets);
  console.log(`consumer started: committed offset ${next}, ${events.length - next} event(s) to deliver`);
  const parked = []; // offsets of premature events, oldest first
  const line = (offset, ev, verdict, note = '') =>
    console.log(`offset ${offset} ${ev.event_id} order ${ev.order} ${ev.type}${note}: ${MEANING[verdict](ev)}`);

  for (; next < events.length; next++) {
    const ev = events[next];
    const verdict = await handle(db, ev);
    line(next, ev, verdict);
    if (verdict === 'premature') parked.push(next);
    if (next === o.crashAfter) {
      console.log(`offset ${next}: committed in the database; crashing (SIGKILL) before committing the offset`);
      process.kill(process.pid, 'SIGKILL');
    }
    // An applied event may have made parked ones applicable; one applied
    // parked event may unblock another, so retry until nothing moves.
    let moved = verdict === 'applied';
    while (moved && parked.length > 0) {
      moved = false;
      for (const p of [...parked]) {
        const v = await handle(db, events[p]);
        if (v === 'premature') continue;
        line(p, events[p], v, ' (parked, retried)');
        parked.splice(parked.indexOf(p), 1);
        moved = moved || v === 'applied';
      }
    }
    // The committed offset never passes a parked event: after a crash, the
    // broker must deliver it again.
    commitOffset(o.offsets, parked.length > 0 ? parked[0] : next + 1);
  }
  if (parked.length > 0) {
    console.log(`end of the log with ${parked.length} event(s) still parked at offsets ${parked.join(', ')}; committed offset ${parked[0]}`);
  }
  const states = await db.query('SELECT id, status FROM orders ORDER BY id');
  console.log('orders now: ' + states.rows.map((r) => `${r.id} ${r.status}`).join(', '));
  await db.end();
}

main().catch((e) => {
  console.error(`consumer: ${e.message}${e.code ? ` (SQLSTATE ${e.code})` : ''}`);
  process.exit(1);
});
