'use strict';
const { Idem, replay, storedResponse, PROBLEMS, DEFAULT_PROBLEM_BASE, TRANSIENT_REFUSALS, defaultStore } = require('./lib/core');
const { parseKeyField } = require('./lib/key');
const { expressMiddleware, expressErrorHandler, keepRawBody } = require('./lib/express');
const { idemFastify } = require('./lib/fastify');
const { canonicalJson, canonicalBody, canonicalRequest, canonicalTarget, fingerprint } = require('./lib/fingerprint');
const { isTransient, isConnectionError, TRANSIENT_SQLSTATES } = require('./lib/errors');

// The integrations as methods, so that one object carries the pool and the
// defaults: idem.express({...}), idem.expressErrorHandler(), idem.fastify.
Idem.prototype.express = function express(options) {
  return expressMiddleware(this, options);
};
Idem.prototype.expressErrorHandler = function errorHandler() {
  return expressErrorHandler(this);
};
// The verify option of Express's body parsers: keeps the bytes the
// fingerprint counts (req.rawBody).
Idem.prototype.rawBody = keepRawBody;
Object.defineProperty(Idem.prototype, 'fastify', {
  get() {
    const idem = this;
    const plugin = (fastify, opts, done) => idemFastify(fastify, { ...opts, idem }, done);
    plugin[Symbol.for('skip-override')] = true;
    plugin[Symbol.for('fastify.display-name')] = 'idem-pg';
    return plugin;
  },
});

/** createIdem({ pool, ...defaults }): the entry point. */
function createIdem(options) {
  return new Idem(options);
}

module.exports = {
  createIdem,
  Idem,
  idemFastify,
  expressMiddleware,
  expressErrorHandler,
  keepRawBody,
  canonicalJson,
  canonicalBody,
  canonicalRequest,
  canonicalTarget,
  parseKeyField,
  PROBLEMS,
  DEFAULT_PROBLEM_BASE,
  TRANSIENT_REFUSALS,
  defaultStore,
  fingerprint,
  isTransient,
  isConnectionError,
  TRANSIENT_SQLSTATES,
  replay,
  storedResponse,
};
