// A user's TypeScript against idem-pg's hand-written index.d.ts: type-checked
// (tsc --strict --noEmit) by tests/scenarios/clients.sh middleware_node.
import { Pool } from 'pg';
import express from 'express';
import { createIdem, fingerprint, isTransient, type IdemContext, type RouteOptions } from 'idem-pg';

const pool = new Pool();
const idem = createIdem({
  pool,
  tenant: (req: { headers: Record<string, unknown> }) => String(req.headers['x-tenant'] ?? ''),
  lockTimeout: 2000,
  hooks: { afterCommit: (ctx: IdemContext) => { void ctx.key; } },
});

const route: RouteOptions = { bizType: 'orders.create', wait: false, excludeFields: ['client_ts'] };
const app = express();
app.use(express.json());
app.post('/orders', idem.express(route), async (req, res) => {
  const ctx = (req as unknown as { idem: IdemContext }).idem;
  const r = await ctx.query<{ id: string }>('INSERT INTO orders (sku) VALUES ($1) RETURNING id', [req.body.sku]);
  const same: IdemContext | undefined = idem.current();
  void same;
  const attempt: number = ctx.attempt; // 2 when a stored failure is retried
  const previous: unknown = ctx.previousError;
  void attempt;
  void previous;
  res.status(201).json({ id: r.rows[0].id });
});
app.use(idem.expressErrorHandler());

async function charge(ctx: IdemContext): Promise<string> {
  if (ctx.lease && ctx.lease.recoveryPoint === 'charged') return String((ctx.lease.recoveryData as { id: string }).id);
  await ctx.checkpoint('charged', { id: 'ch_1' });
  return 'ch_1';
}
void charge;

const fp: string = fingerprint({ method: 'POST', path: '/orders', body: { a: 1 } });
const transient: boolean = isTransient(new Error('x'));
void fp;
void transient;
// A fastify plugin, registered as users do.
const plugin = idem.fastify;
void plugin;
