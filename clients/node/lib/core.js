'use strict';
// The framework-neutral core: read the key, claim it in a transaction on one
// pooled connection, hand that connection to the handler, store the response
// with idem_complete / idem_fail before COMMIT, replay it to duplicates, and
// map idem's states and SQLSTATEs to HTTP answers (docs/http.md).
const { AsyncLocalStorage } = require('node:async_hooks');
const { fingerprint: defaultFingerprint } = require('./fingerprint');
const { isTransient, isConnectionError } = require('./errors');

const BIZ_TYPE = /^[A-Za-z0-9_.:-]{1,64}$/;
const SCHEMA = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MAX_KEY_BYTES = 1024; // idem refuses longer keys with 22023

const DEFAULTS = {
  keyHeader: 'idempotency-key',
  keyPattern: /^[\x21-\x7e]{16,255}$/, // visible ASCII, as docs/http.md suggests
  required: true,
  wait: true,
  lockTimeout: 5000, // ms a duplicate waits for the first request's transaction; 0: no bound
  retryAfter: 1, // seconds, on 409 (no wait) and 503
  lease: null, // seconds: lease mode (the claim commits first; see README)
  store: (status) => status < 500,
  storeHeaders: ['content-type', 'location'],
  maxStoredBody: 64 * 1024,
  excludeFields: [],
  fingerprint: null, // (req) => string | null, replaces the computed one
  tenant: null, // (req) => string | null: the authenticated principal's tenant
  problemBase: 'urn:idem:problem:',
  hooks: {},
};

function problem(options, status, slug, title, extraHeaders) {
  return {
    status,
    headers: { 'content-type': 'application/problem+json', ...(extraHeaders || {}) },
    body: Buffer.from(JSON.stringify({ type: options.problemBase + slug, title, status })),
  };
}

// A stored response, as jsonb: {status, headers, body, encoding} where body
// is the exact bytes (utf8 text, or base64), so that a replay is byte for
// byte; body_omitted when the body was streamed or over maxStoredBody.
function storedResponse(route, status, headers, body, omitted) {
  const picked = {};
  for (const name of route.storeHeaders) {
    const v = headers[name.toLowerCase()];
    if (v !== undefined) picked[name.toLowerCase()] = Array.isArray(v) ? v.map(String) : String(v);
  }
  const doc = { status, headers: picked };
  if (omitted) {
    doc.body = null;
    doc.body_omitted = true;
  } else if (body && body.length > 0) {
    const text = body.toString('utf8');
    if (Buffer.from(text, 'utf8').equals(body)) {
      doc.body = text;
    } else {
      doc.body = body.toString('base64');
      doc.encoding = 'base64';
    }
  } else {
    doc.body = null;
  }
  return doc;
}

// The response a duplicate gets: the stored one, with Idempotent-Replayed.
// A claim finished by other code may hold a JSON body (docs/http.md's SQL
// handler) or nothing at all.
function replay(result) {
  const doc = result && typeof result === 'object' ? result : {};
  const headers = {};
  for (const [k, v] of Object.entries(doc.headers || {})) headers[k.toLowerCase()] = v;
  let body = null;
  if (typeof doc.body === 'string') body = Buffer.from(doc.body, doc.encoding === 'base64' ? 'base64' : 'utf8');
  else if (doc.body !== undefined && doc.body !== null) {
    body = Buffer.from(JSON.stringify(doc.body));
    if (!headers['content-type']) headers['content-type'] = 'application/json';
  }
  headers['idempotent-replayed'] = 'true';
  if (doc.body_omitted) headers['idempotent-body-omitted'] = 'true';
  const status = Number.isInteger(doc.status) ? doc.status : body ? 200 : 204;
  return { status, headers, body };
}

class Idem {
  /**
   * @param {object} options pool (a pg.Pool) and defaults for every route
   */
  constructor(options) {
    if (!options || !options.pool || typeof options.pool.connect !== 'function') {
      throw new TypeError('idem-pg: options.pool must be a pg.Pool');
    }
    const { pool, schema, ...rest } = options;
    this.pool = pool;
    if (schema !== undefined && !SCHEMA.test(schema)) throw new TypeError(`idem-pg: bad schema name ${schema}`);
    this.fn = schema ? (name) => `${schema}.${name}` : (name) => name;
    this.defaults = { ...DEFAULTS, ...rest, hooks: { ...(rest.hooks || {}) } };
    this.als = new AsyncLocalStorage();
  }

  /** The idempotency context of the request being handled (AsyncLocalStorage), or undefined. */
  current() {
    return this.als.getStore();
  }

  /** Route options merged over the defaults, checked once. */
  route(options) {
    const route = { ...this.defaults, ...(options || {}) };
    route.hooks = { ...this.defaults.hooks, ...((options && options.hooks) || {}) };
    if (!BIZ_TYPE.test(String(route.bizType || ''))) {
      throw new TypeError(`idem-pg: bizType must match ${BIZ_TYPE} (got ${route.bizType})`);
    }
    if (!Number.isInteger(route.lockTimeout) || route.lockTimeout < 0) throw new TypeError('idem-pg: lockTimeout is whole milliseconds');
    if (route.lease !== null && !(Number.isInteger(route.lease) && route.lease >= 1)) throw new TypeError('idem-pg: lease is whole seconds (>= 1)');
    route.keyHeader = route.keyHeader.toLowerCase();
    route.storeHeaders = route.storeHeaders.map((h) => h.toLowerCase());
    return route;
  }

  /**
   * Start handling a request. `req` is {method, path, headers (lower-case
   * names), body}; `raw` is the framework's request, given to the hooks.
   * Resolves to {response} (answer it, nothing to run) or {ctx} (run the
   * handler with ctx.client, then call finish).
   */
  async begin(req, route, raw) {
    let key = req.headers[route.keyHeader];
    if (Array.isArray(key)) key = key.length === 1 ? key[0] : undefined;
    if (typeof key === 'string') {
      key = key.trim();
      // The draft's header is a structured-field string: "…"; bare is accepted too.
      if (key.length >= 2 && key.startsWith('"') && key.endsWith('"')) key = key.slice(1, -1);
    }
    if (key === undefined || key === null || key === '') {
      if (route.required) {
        return { response: problem(route, 400, 'idempotency-key-missing', 'An Idempotency-Key header is required') };
      }
      return this.#open(route, null, null, raw);
    }
    if (!route.keyPattern.test(key)) {
      return { response: problem(route, 400, 'idempotency-key-invalid', `The Idempotency-Key header must match ${route.keyPattern}`) };
    }
    // The tenant comes from authentication, never from a header the client
    // picks: without it two tenants sending one key would share a claim.
    const tenant = route.tenant ? await route.tenant(raw) : null;
    const scoped = tenant === null || tenant === undefined ? key : `${tenant}:${key}`;
    if (Buffer.byteLength(scoped, 'utf8') > MAX_KEY_BYTES) {
      return { response: problem(route, 400, 'idempotency-key-invalid', 'The Idempotency-Key header is too long') };
    }
    const fp = route.fingerprint
      ? await route.fingerprint(raw)
      : defaultFingerprint({ method: req.method, path: req.path, body: req.body }, route.excludeFields);
    return this.#open(route, key, scoped, raw, fp);
  }

  async #open(route, clientKey, scoped, raw, fp) {
    let client;
    try {
      client = await this.pool.connect();
    } catch (err) {
      return { response: this.#unavailable(route, err) };
    }
    // A checked-out client whose connection breaks emits 'error'; with no
    // listener that would end the process. The failing query rejects too,
    // which is where the request learns of it.
    const onConnectionError = (err) => {
      ctx.connectionError = err;
    };
    client.on('error', onConnectionError);
    const ctx = {
      client,
      connectionError: null,
      onConnectionError,
      query: (text, values) => client.query(text, values),
      key: scoped,
      clientKey,
      bizType: route.bizType,
      claim: null,
      lease: null,
      replayed: false,
      request: raw,
      route,
      finished: false,
      released: false,
      checkpoint: async () => {
        throw new Error('idem-pg: checkpoint() needs a route in lease mode');
      },
    };
    try {
      if (scoped === null) {
        await client.query('BEGIN');
        return { ctx };
      }
      // One simple-protocol round trip: BEGIN and the bound of the wait (a
      // transaction-local setting: nothing is left on a pooled session).
      const res = await client.query(
        `BEGIN; SELECT current_setting('lock_timeout') AS previous, set_config('lock_timeout', '${route.lockTimeout}ms', true)`);
      const previous = res[1].rows[0].previous;
      const args = [scoped, route.bizType, fp === undefined ? null : fp, route.wait];
      let sql = `SELECT claimed, state, result FROM ${this.fn('idem_claim')}($1, $2, fingerprint => $3, wait => $4`;
      if (route.lease !== null) {
        args.push(route.lease);
        sql += ', lease => make_interval(secs => $5)';
      }
      const c = (await client.query(sql + ')', args)).rows[0];
      ctx.claim = c;
      if (!c.claimed) {
        await client.query('ROLLBACK');
        this.#release(ctx);
        ctx.finished = true;
        if (c.state === 'in_progress') {
          const retry = route.lease !== null ? route.lease : route.retryAfter;
          return { response: problem(route, 409, 'request-in-progress', 'A request with this Idempotency-Key is being processed', { 'retry-after': String(retry) }) };
        }
        return { response: replay(c.result), replayed: true };
      }
      await client.query('SELECT set_config(\'lock_timeout\', $1, true)', [previous]);
      if (route.lease !== null) {
        // Lease mode: the claim commits now, so that it outlives this process
        // and a takeover finds the recovery points; the handler's writes and
        // the stored response are a second transaction on the same connection.
        const r = c.result || {};
        ctx.lease = {
          token: r.lease_token,
          attempt: r.attempt || 1,
          recoveryPoint: r.recovery_point === undefined ? null : r.recovery_point,
          recoveryData: r.recovery_data === undefined ? null : r.recovery_data,
          until: r.lease_until || null,
        };
        await client.query('COMMIT');
        await client.query('BEGIN');
        ctx.checkpoint = (point, data) => this.#checkpoint(ctx, point, data);
      }
      return { ctx };
    } catch (err) {
      await this.#discard(ctx, err);
      if (err && err.code === 'ID001') {
        return { response: problem(route, 422, 'idempotency-key-reused', 'This Idempotency-Key was used for a different request') };
      }
      if (isTransient(err)) return { response: this.#unavailable(route, err) };
      throw err;
    }
  }

  // A recovery point, committed at once on its own connection (the request's
  // transaction may still roll back); it renews the lease.
  async #checkpoint(ctx, point, data) {
    const other = await this.pool.connect();
    let failure;
    const onError = (err) => {
      failure = failure || err;
    };
    other.on('error', onError);
    try {
      await other.query(`SELECT ${this.fn('idem_checkpoint')}($1, $2, $3, $4::jsonb, $5)`,
        [ctx.key, ctx.bizType, point, data === undefined ? null : JSON.stringify(data), ctx.lease.token]);
      ctx.lease.recoveryPoint = point;
      ctx.lease.recoveryData = data === undefined ? null : data;
    } catch (err) {
      failure = err;
      throw err;
    } finally {
      other.removeListener('error', onError);
      other.release(isConnectionError(failure) ? failure : undefined);
    }
  }

  /**
   * The handler answered: {status, headers (lower-case names), body (Buffer
   * or null), streamed}. Stores the response and commits, or rolls back (a
   * status the route does not store: 5xx by default). Resolves to {} (send
   * the handler's response) or {response} (send this instead: storing or
   * committing failed, nothing was committed or the outcome is unknown).
   */
  async finish(ctx, { status, headers, body, streamed }) {
    if (ctx.finished) return {};
    ctx.finished = true;
    const route = ctx.route;
    const client = ctx.client;
    try {
      if (!route.store(status)) {
        await client.query('ROLLBACK');
        this.#release(ctx);
        return {};
      }
      if (ctx.key !== null) {
        const omitted = Boolean(streamed) || (body !== null && body !== undefined && body.length > route.maxStoredBody);
        const doc = storedResponse(route, status, headers, body, omitted);
        const fn = status >= 400 ? 'idem_fail' : 'idem_complete';
        await client.query(`SELECT ${this.fn(fn)}($1, $2, $3::jsonb, lease_token => $4)`,
          [ctx.key, ctx.bizType, JSON.stringify(doc), ctx.lease ? ctx.lease.token : null]);
      }
      if (route.hooks.beforeCommit) await route.hooks.beforeCommit(ctx);
      await client.query('COMMIT');
      this.#release(ctx);
    } catch (err) {
      await this.#discard(ctx, err);
      if (isTransient(err)) return { response: this.#unavailable(route, err) };
      return { response: problem(route, 500, 'internal-error', 'The response could not be stored; nothing was committed') };
    }
    // Committed: whatever the hook does, the handler's answer is the one to send.
    if (route.hooks.afterCommit) {
      try {
        await route.hooks.afterCommit(ctx);
      } catch {
        // (a failing observer must not turn a committed answer into an error)
      }
    }
    return {};
  }

  // Roll back and give the connection back (destroyed if it is broken).
  async #discard(ctx, err) {
    ctx.finished = true;
    if (ctx.released) return;
    const client = ctx.client;
    let broken = isConnectionError(err) ? err : undefined;
    if (!broken) {
      try {
        await client.query('ROLLBACK');
      } catch (e) {
        broken = e;
      }
    }
    this.#release(ctx, broken);
  }

  #release(ctx, err) {
    if (ctx.released) return;
    ctx.released = true;
    ctx.client.removeListener('error', ctx.onConnectionError);
    ctx.client.release(err || ctx.connectionError || undefined);
  }

  #unavailable(route, err) {
    const code = err && err.code ? ` (${err.code})` : '';
    return problem(route, 503, 'transient-failure', `A transient database failure${code}; retry with the same Idempotency-Key`,
      { 'retry-after': String(route.retryAfter) });
  }

  /** The answer for an error the handler threw: 503 if transient, else null (let the framework answer). */
  responseForError(route, err) {
    return isTransient(err) ? this.#unavailable(route, err) : null;
  }
}

module.exports = { Idem, replay, storedResponse, DEFAULTS };
