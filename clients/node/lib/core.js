'use strict';
// The framework-neutral core: read the key, claim it in a transaction on one
// pooled connection, hand that connection to the handler, store the response
// with idem_complete / idem_fail before COMMIT, replay it to duplicates, and
// map idem's states and SQLSTATEs to HTTP answers (docs/http.md).
const { AsyncLocalStorage } = require('node:async_hooks');
const { fingerprint: defaultFingerprint } = require('./fingerprint');
const { isTransient, isConnectionError } = require('./errors');
const { parseKeyField } = require('./key');

const BIZ_TYPE = /^[A-Za-z0-9_.:-]{1,64}$/;
const SCHEMA = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MAX_KEY_BYTES = 1024; // idem refuses longer keys with 22023

// Where the problem types are documented: a problem's "type" is this base
// followed by its slug (an anchor of docs/http.md, "Problem types").
const DEFAULT_PROBLEM_BASE = 'https://github.com/idem-pg/idem/blob/main/docs/http.md#';

// The problem types (docs/http.md, "Problem types"): slug -> [status, title].
// The title is the type's, the same for every occurrence; what differs from
// case to case goes into "detail".
const PROBLEMS = {
  'idempotency-key-missing': [400, 'Idempotency-Key missing'],
  'idempotency-key-invalid': [400, 'Idempotency-Key invalid'],
  'idempotency-key-reused': [422, 'Idempotency-Key reused for a different request'],
  'request-in-progress': [409, 'Request in progress'],
  'response-not-replayable': [422, 'Stored response not replayable'],
  'transient-failure': [503, 'Transient failure'],
  'tenant-missing': [500, 'No tenant for this request'],
  'internal-error': [500, 'Response not stored'],
};

// Refusals that say nothing about the operation, only about this attempt:
// authentication (401, 407), authorization or CSRF (403), a timeout (408),
// too early (425), rate limiting (429). Never stored, whatever the class.
const TRANSIENT_REFUSALS = new Set([401, 403, 407, 408, 425, 429]);

// 2xx and 3xx are stored (idem_complete), the deterministic 4xx (400, 404,
// 409, 422, ...) as a business failure (idem_fail); never TRANSIENT_REFUSALS
// or 5xx: those roll back, claim included, so that a retry runs.
function defaultStore(status) {
  return !TRANSIENT_REFUSALS.has(status) && status >= 200 && status < 500;
}

// The scope of a request without a tenant (singleTenant, or anonymous): "-",
// which no tenant's scope ("<length>:<tenant>") can equal.
const SHARED_SCOPE = '-';

const DEFAULTS = {
  keyHeader: 'idempotency-key',
  minKeyLength: 16,
  maxKeyLength: 255,
  bareKeys: false, // accept an unquoted key too (Stripe-style clients)
  required: true,
  wait: true,
  lockTimeout: 5000, // ms a duplicate waits for the first request's transaction (then 409); 0: no bound
  retryAfter: 1, // seconds, on 409 and 503 (a route may set its own, e.g. a leased route)
  lease: null, // seconds: lease mode (the claim commits first; see README)
  store: defaultStore,
  storeHeaders: ['content-type', 'location'],
  maxStoredBody: 64 * 1024,
  excludeFields: [],
  fingerprint: null, // (req) => string | null, replaces the computed one
  tenant: null, // (req) => string | null: the authenticated principal's tenant
  singleTenant: false, // no tenant hook: every caller shares one key space
  anonymous: false, // with a tenant hook: no tenant -> the shared scope, instead of 500
  problemBase: DEFAULT_PROBLEM_BASE,
  prepare: false, // the claim as a named prepared statement, after its own BEGIN (not behind PgBouncer in transaction mode before 1.21)
  logger: console,
  hooks: {},
};

function problem(options, slug, detail, extraHeaders) {
  const [status, title] = PROBLEMS[slug];
  return {
    status,
    headers: { 'content-type': 'application/problem+json', ...(extraHeaders || {}) },
    body: Buffer.from(JSON.stringify({ type: options.problemBase + slug, title, status, detail })),
  };
}

// Retry-After is the route's retryAfter in lease mode too (docs/http.md,
// "In progress"): a leased route whose work takes long sets its own.
function inProgress(route) {
  return problem(route, 'request-in-progress', 'A request with this Idempotency-Key is being processed; retry later with the same key.',
    { 'retry-after': String(route.retryAfter) });
}

// The claimed key: the scope, ":", the client's key. Injective: a tenant's
// scope says its own length, and "-" is no tenant's.
function scopeOf(tenant) {
  return tenant === null ? SHARED_SCOPE : `${Buffer.byteLength(tenant, 'utf8')}:${tenant}`;
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
// A claim finished by other code may hold a response with a JSON body
// (docs/http.md's SQL handler), or no response at all (no integer status):
// completed, that is 204 (done, nothing to show: other code's result is not
// the client's to see); failed, 422 response-not-replayable (docs/http.md,
// "Finished by other code").
function storedReplay(result) {
  const doc = result && typeof result === 'object' && !Array.isArray(result) ? result : null;
  if (!doc || !Number.isInteger(doc.status) || doc.status < 100 || doc.status > 599) return null;
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
  return { status: doc.status, headers, body };
}

// expires (an HTTP-date: until when the key's answer is kept) goes out as
// Idempotent-Expires.
function replay(result, state = 'completed', route = DEFAULTS, expires = null) {
  const stored = storedReplay(result);
  if (stored) {
    if (expires) stored.headers['idempotent-expires'] = expires;
    return stored;
  }
  if (state === 'completed') {
    const headers = { 'idempotent-replayed': 'true' };
    if (expires) headers['idempotent-expires'] = expires;
    return { status: 204, headers, body: null };
  }
  return problem(route, 'response-not-replayable',
    'The request with this Idempotency-Key failed, and no response was stored for it; a new request needs a new key.');
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
    this.schemaTag = schema || '';
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
    if (!route.tenant && !route.singleTenant) {
      throw new TypeError(`idem-pg: route ${route.bizType}: choose the key scope: tenant: (req) => <the authenticated caller's tenant> `
        + '(keys of different tenants never meet), or singleTenant: true (every caller shares one key space). '
        + 'Without either, one caller could be replayed another\'s response.');
    }
    if (route.tenant && route.singleTenant) throw new TypeError('idem-pg: tenant and singleTenant: true exclude each other');
    if (route.anonymous && !route.tenant) throw new TypeError('idem-pg: anonymous: true needs a tenant hook');
    if (!(Number.isInteger(route.minKeyLength) && Number.isInteger(route.maxKeyLength)
      && route.minKeyLength >= 1 && route.minKeyLength <= route.maxKeyLength && route.maxKeyLength <= 255)) {
      throw new TypeError('idem-pg: need 1 <= minKeyLength <= maxKeyLength <= 255');
    }
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
    let field = req.headers[route.keyHeader];
    // Field lines arrive joined with ", " (node:http); an array is joined the same way.
    if (Array.isArray(field)) field = field.join(', ');
    if (field === undefined || field === null) {
      if (route.required) {
        return { response: problem(route, 'idempotency-key-missing',
          `Send Idempotency-Key: "<key>", ${route.minKeyLength} to ${route.maxKeyLength} visible ASCII characters, made once per intent.`) };
      }
      return this.#open(route, null, null, raw);
    }
    const parsed = parseKeyField(String(field), route);
    if (parsed.key === null) {
      return { response: problem(route, 'idempotency-key-invalid', `Idempotency-Key: ${parsed.why}.`) };
    }
    const key = parsed.key;
    // The tenant comes from authentication, never from a header the client
    // picks: without it two tenants sending one key would share a claim.
    let tenant = null;
    if (route.tenant) {
      tenant = await route.tenant(raw);
      if (tenant === undefined || tenant === '') tenant = null;
      if (tenant !== null && typeof tenant !== 'string') throw new TypeError(`idem-pg: the tenant hook must return a string or null, not ${typeof tenant}`);
      if (tenant === null && !route.anonymous) {
        route.logger.error(`idem-pg: the tenant hook returned no tenant for ${req.method} ${req.path} (route ${route.bizType}); answered 500. `
          + 'Authenticate before this middleware, or allow anonymous callers (anonymous: true).');
        return { response: problem(route, 'tenant-missing', 'The server found no tenant for this request; nothing was done.') };
      }
    }
    const scope = scopeOf(tenant);
    const scoped = `${scope}:${key}`;
    if (Buffer.byteLength(scoped, 'utf8') > MAX_KEY_BYTES) {
      return { response: problem(route, 'idempotency-key-invalid', 'Idempotency-Key: the key and the tenant are longer than 1024 bytes.') };
    }
    const fp = route.fingerprint
      ? await route.fingerprint(raw)
      : defaultFingerprint({ method: req.method, path: req.path, body: req.body, scope }, route.excludeFields);
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
      attempt: 1,
      previousError: null,
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
      // The claim and the bound of its wait in one statement: lock_timeout
      // is made transaction-local before the claim (the CTE is evaluated
      // first: the claim's key comes from it) and restored after it (the
      // select list is evaluated on the claim's row), so that the handler's
      // own lock waits keep the session's setting. With prepare: a named
      // statement, parsed once per connection, after its own BEGIN; else
      // BEGIN and the claim go as one simple query (one round trip), the
      // values as escaped literals.
      const args = [scoped, `${route.lockTimeout}ms`, route.bizType, fp === undefined ? null : fp, route.wait];
      if (route.lease !== null) args.push(route.lease);
      let c;
      try {
        if (route.prepare) {
          await client.query('BEGIN');
          const name = `idem_claim_${this.schemaTag}${route.lease !== null ? '_lease' : ''}`;
          c = (await client.query({ name, text: this.#claimText(route, (i) => `$${i + 1}`), values: args })).rows[0];
        } else {
          const literal = (i) => (args[i] === null ? 'NULL' : typeof args[i] === 'string' ? client.escapeLiteral(args[i]) : String(args[i]));
          c = (await client.query(`BEGIN; ${this.#claimText(route, literal)}`))[1].rows[0];
        }
      } catch (err) {
        if (err && err.code === '55P03') {
          // The wait for the first request's transaction ran out: still in progress.
          await this.#discard(ctx, err);
          return { response: inProgress(route) };
        }
        throw err;
      }
      ctx.claim = c;
      if (!c.claimed) {
        await client.query('ROLLBACK');
        this.#release(ctx);
        ctx.finished = true;
        if (c.state === 'in_progress') return { response: inProgress(route) };
        const expires = c.expires_at ? new Date(c.expires_at).toUTCString() : null;
        return { response: replay(c.result, c.state, route, expires), replayed: true };
      }
      // Which attempt this is, and what the last one left: idem_claim tells
      // a new claim {attempt, previous_error} when it retries a stored
      // failure (the type's on_failure 'retry'), and a takeover of a lease
      // the lease document (attempt, recovery point, the failure it kept).
      const told = c.result && typeof c.result === 'object' && !Array.isArray(c.result) ? c.result : {};
      ctx.attempt = Number.isInteger(told.attempt) && told.attempt > 1 ? told.attempt : 1;
      ctx.previousError = told.previous_error === undefined ? null : told.previous_error;
      if (route.lease !== null) {
        // Lease mode: the claim commits now, so that it outlives this process
        // and a takeover finds the recovery points; the handler's writes and
        // the stored response are a second transaction on the same connection.
        ctx.lease = {
          token: told.lease_token,
          attempt: ctx.attempt,
          recoveryPoint: told.recovery_point === undefined ? null : told.recovery_point,
          recoveryData: told.recovery_data === undefined ? null : told.recovery_data,
          until: told.lease_until || null,
        };
        await client.query('COMMIT; BEGIN');
        ctx.checkpoint = (point, data) => this.#checkpoint(ctx, point, data);
      }
      return { ctx };
    } catch (err) {
      await this.#discard(ctx, err);
      if (err && err.code === 'ID001') {
        return { response: problem(route, 'idempotency-key-reused', 'This Idempotency-Key was first used for a different request; do not retry this request, a new request needs a new key.') };
      }
      if (isTransient(err)) return { response: this.#unavailable(route, err) };
      throw err;
    }
  }

  // The claim statement, its values written by value(i): $1 key, $2
  // lock_timeout, $3 biz_type, $4 fingerprint, $5 wait, $6 lease seconds.
  #claimText(route, value) {
    const lease = route.lease !== null ? `, lease => make_interval(secs => ${value(5)})` : '';
    return `WITH s AS MATERIALIZED (SELECT ${value(0)}::text AS k, current_setting('lock_timeout') AS prev, `
      + `set_config('lock_timeout', ${value(1)}, true) AS bound) `
      + 'SELECT c.claimed, c.state, c.result, c.expires_at, set_config(\'lock_timeout\', s.prev, true) '
      + `FROM s, LATERAL ${this.fn('idem_claim')}(s.k, ${value(2)}, fingerprint => ${value(3)}, wait => ${value(4)}${lease}) c`;
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
        // Not stored: rolled back; in lease mode the lease is handed back
        // too (its claim committed already), so that the retry runs at once.
        await client.query('ROLLBACK');
        this.#release(ctx, ctx.lease ? await this.#handBack(ctx) : undefined);
        return {};
      }
      if (ctx.key === null) {
        if (route.hooks.beforeCommit) await route.hooks.beforeCommit(ctx);
        await client.query('COMMIT');
      } else {
        const omitted = Boolean(streamed) || (body !== null && body !== undefined && body.length > route.maxStoredBody);
        const doc = storedResponse(route, status, headers, body, omitted);
        const fn = this.fn(status >= 400 ? 'idem_fail' : 'idem_complete');
        const token = ctx.lease ? ctx.lease.token : null;
        if (route.hooks.beforeCommit) {
          await client.query(`SELECT ${fn}($1, $2, $3::jsonb, lease_token => $4)`,
            [ctx.key, ctx.bizType, JSON.stringify(doc), token]);
          await route.hooks.beforeCommit(ctx);
          await client.query('COMMIT');
        } else {
          // The stored response and COMMIT in one round trip (one simple
          // query, the values as escaped literals): if storing fails, the
          // COMMIT does not run and the catch below rolls back.
          const lit = (v) => (v === null ? 'NULL' : client.escapeLiteral(v));
          await client.query(`SELECT ${fn}(${lit(ctx.key)}, ${lit(ctx.bizType)}, ${lit(JSON.stringify(doc))}::jsonb, `
            + `lease_token => ${lit(token)}); COMMIT`);
        }
      }
      this.#release(ctx);
    } catch (err) {
      await this.#discard(ctx, err);
      if (isTransient(err)) return { response: this.#unavailable(route, err) };
      return { response: problem(route, 'internal-error', 'The response could not be stored; nothing was committed.') };
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
      if (!broken && ctx.lease) broken = await this.#handBack(ctx);
    }
    this.#release(ctx, broken);
  }

  // Lease mode, the answer not stored: hand the lease back (idem_release),
  // so that the client's retry takes it over at once instead of waiting
  // for it to run out. Best effort: if it fails (the lease was taken over
  // meanwhile), the lease runs out as after a crash. Resolves to the error
  // if the connection broke, else undefined.
  async #handBack(ctx) {
    try {
      await ctx.client.query(`SELECT ${this.fn('idem_release')}($1, $2, $3)`, [ctx.key, ctx.bizType, ctx.lease.token]);
      return undefined;
    } catch (e) {
      return isConnectionError(e) ? e : undefined;
    }
  }

  #release(ctx, err) {
    if (ctx.released) return;
    ctx.released = true;
    ctx.client.removeListener('error', ctx.onConnectionError);
    ctx.client.release(err || ctx.connectionError || undefined);
  }

  #unavailable(route, err) {
    const code = err && err.code ? err.code : 'connection lost';
    return problem(route, 'transient-failure', `A transient database failure (${code}); nothing was done, retry with the same Idempotency-Key.`,
      { 'retry-after': String(route.retryAfter) });
  }

  /** The answer for an error the handler threw: 503 if transient, else null (let the framework answer). */
  responseForError(route, err) {
    return isTransient(err) ? this.#unavailable(route, err) : null;
  }
}

module.exports = { Idem, replay, storedResponse, DEFAULTS, PROBLEMS, DEFAULT_PROBLEM_BASE, TRANSIENT_REFUSALS, defaultStore };
