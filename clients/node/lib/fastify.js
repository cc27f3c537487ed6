'use strict';
// Fastify (tested with 5): a plugin. Routes opt in with
//   config: { idem: { bizType: 'orders.create', ... } }
// The claim runs in a preHandler; the connection is request.idem.client (or
// idem.current()); the response is stored and committed in onSend, before
// Fastify writes it. A stream payload passes through unstored (the claim
// commits with status and headers).

const { Transform } = require('node:stream');

const RAW_BODY = Symbol('idem-pg raw body');

function send(reply, response) {
  reply.code(response.status);
  for (const [k, v] of Object.entries(response.headers)) reply.header(k, v);
  reply.send(response.body || '');
}

function asArray(v) {
  if (!v) return [];
  return Array.isArray(v) ? v : [v];
}

function payloadBuffer(payload) {
  if (payload === undefined || payload === null) return { body: null, streamed: false };
  if (Buffer.isBuffer(payload)) return { body: payload, streamed: false };
  if (typeof payload === 'string') return { body: Buffer.from(payload, 'utf8'), streamed: false };
  if (typeof payload.pipe === 'function' || typeof payload.getReader === 'function') return { body: null, streamed: true };
  return { body: Buffer.from(String(payload)), streamed: false };
}

function idemFastify(fastify, opts, done) {
  const idem = opts.idem;
  if (!idem) return done(new TypeError('idem-pg: register with { idem } (an Idem instance)'));
  fastify.decorateRequest('idem', null);

  fastify.addHook('onRoute', (routeOptions) => {
    const config = routeOptions.config && routeOptions.config.idem;
    if (!config) return;
    const route = idem.route(config);

    // The body's bytes as received, whatever parser reads them after this
    // hook (a form parser gives fields, in which reordered or re-escaped
    // fields would look the same): the fingerprint counts the bytes, as in
    // the other idem clients (docs/http.md, "The fingerprint").
    const keepBody = function idemKeepBody(request, reply, payload, done) {
      const chunks = [];
      request[RAW_BODY] = chunks;
      done(null, payload.pipe(new Transform({
        transform(chunk, encoding, cb) {
          chunks.push(chunk);
          cb(null, chunk);
        },
      })));
    };
    routeOptions.preParsing = [...asArray(routeOptions.preParsing), keepBody];

    const claim = function idemClaim(request, reply, next) {
      const chunks = request[RAW_BODY] || [];
      const body = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
      const view = { method: request.method, path: request.url, headers: request.headers, body };
      idem.begin(view, route, request).then((outcome) => {
        if (outcome.response) {
          send(reply, outcome.response); // answered from the hook: the handler does not run
          return;
        }
        request.idem = outcome.ctx;
        idem.als.run(outcome.ctx, next);
      }, next);
    };
    routeOptions.preHandler = [...asArray(routeOptions.preHandler), claim];

    // A transient database error from the handler: 503 with Retry-After,
    // rolled back in onSend like any answer the route does not store.
    const handler = routeOptions.handler;
    routeOptions.handler = function idemHandler(request, reply) {
      const transient = (err) => {
        const response = request.idem && !reply.sent ? idem.responseForError(route, err) : null;
        if (!response) throw err;
        send(reply, response);
        return reply;
      };
      let result;
      try {
        result = handler.call(this, request, reply);
      } catch (err) {
        return transient(err);
      }
      if (result && typeof result.then === 'function') return result.then(undefined, transient);
      return result;
    };

    const store = async function idemStore(request, reply, payload) {
      const ctx = request.idem;
      if (!ctx || ctx.finished) return payload;
      const { body, streamed } = payloadBuffer(payload);
      const headers = {};
      for (const [k, v] of Object.entries(reply.getHeaders())) headers[k.toLowerCase()] = v;
      const outcome = await idem.finish(ctx, { status: reply.statusCode, headers, body, streamed });
      if (!outcome.response) return payload;
      for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
      reply.code(outcome.response.status);
      for (const [k, v] of Object.entries(outcome.response.headers)) reply.header(k, v);
      return outcome.response.body;
    };
    routeOptions.onSend = [...asArray(routeOptions.onSend), store];

    // Whatever happened (a response that never reached onSend), the
    // connection goes back to the pool, rolled back.
    const cleanup = async function idemCleanup(request) {
      const ctx = request.idem;
      if (ctx && !ctx.finished) await idem.finish(ctx, { status: 500, headers: {}, body: null, streamed: false });
    };
    routeOptions.onResponse = [...asArray(routeOptions.onResponse), cleanup];
  });
  done();
}
// What fastify-plugin does: the hooks apply to the routes of the instance
// that registers the plugin, not only inside the plugin's own scope.
idemFastify[Symbol.for('skip-override')] = true;
idemFastify[Symbol.for('fastify.display-name')] = 'idem-pg';

module.exports = { idemFastify };
