'use strict';
// Express (tested with 5): a per-route middleware. The claim runs before the
// handler; the handler's connection is req.idem.client (or idem.current()
// anywhere below it); the response is held back at res.end until it is
// stored and committed, then sent. A body written with res.write (a stream)
// is passed through unstored: the claim commits with status and headers
// before the first byte goes out.

function headersOf(res) {
  const out = {};
  for (const [k, v] of Object.entries(res.getHeaders())) out[k.toLowerCase()] = v;
  return out;
}

function send(res, response) {
  res.statusCode = response.status;
  for (const [k, v] of Object.entries(response.headers)) res.setHeader(k, v);
  if (response.body) res.setHeader('content-length', response.body.length);
  res.end(response.body || undefined);
}

function toBuffer(chunk, encoding) {
  if (chunk === undefined || chunk === null) return null;
  if (Buffer.isBuffer(chunk)) return chunk;
  if (chunk instanceof Uint8Array) return Buffer.from(chunk);
  return Buffer.from(String(chunk), typeof encoding === 'string' ? encoding : 'utf8');
}

// Hold the response until the transaction is finished.
function intercept(idem, ctx, res) {
  const original = { write: res.write, end: res.end, writeHead: res.writeHead };
  let gate = null; // the finish, once started; every later write waits for it
  let replacement = null;

  const restore = () => {
    res.write = original.write;
    res.end = original.end;
    res.writeHead = original.writeHead;
  };
  const start = (body, streamed) => {
    gate = idem.finish(ctx, { status: res.statusCode, headers: headersOf(res), body, streamed })
      .then((outcome) => {
        restore();
        if (outcome.response) {
          replacement = outcome.response;
          for (const name of res.getHeaderNames()) res.removeHeader(name);
          send(res, replacement);
        }
      });
    return gate;
  };

  // writeHead would send the status line at once: keep its status and
  // headers on the response instead, for the stored copy.
  res.writeHead = function writeHead(status, reason, headers) {
    if (typeof reason !== 'string') headers = reason;
    res.statusCode = status;
    if (Array.isArray(headers)) {
      for (let i = 0; i + 1 < headers.length; i += 2) res.setHeader(headers[i], headers[i + 1]);
    } else if (headers) {
      for (const [k, v] of Object.entries(headers)) res.setHeader(k, v);
    }
    return res;
  };
  res.write = function write(chunk, encoding, cb) {
    if (!gate) start(null, true);
    gate.then(() => {
      if (!replacement) res.write(chunk, encoding, cb);
    });
    return true;
  };
  res.end = function end(chunk, encoding, cb) {
    if (typeof chunk === 'function') {
      cb = chunk;
      chunk = undefined;
    } else if (typeof encoding === 'function') {
      cb = encoding;
      encoding = undefined;
    }
    if (!gate) start(toBuffer(chunk, encoding), false);
    gate.then(() => {
      if (replacement) {
        if (cb) cb();
      } else {
        res.end(chunk, encoding, cb);
      }
    });
    return res;
  };
}

/**
 * The verify option of Express's body parsers: keeps the bytes the parser
 * read (req.rawBody), which the fingerprint counts, as the other idem
 * clients do (docs/http.md, "The fingerprint"):
 *   app.use(express.json({ verify: idem.rawBody }), express.urlencoded({ extended: false, verify: idem.rawBody }))
 */
function keepRawBody(req, res, buf) {
  req.rawBody = buf;
}

// The request body as received: kept by a parser (keepRawBody), or read
// here when no parser has read the stream (it is then req.rawBody for the
// handler). A body a parser consumed without keeping its bytes cannot be
// fingerprinted as the rule says: an error, not a second rule (a parsed
// form would count as its fields, so reordered fields would replay).
function bodyBytes(req) {
  if (Buffer.isBuffer(req.rawBody)) return Promise.resolve(req.rawBody);
  if (req.readableEnded) {
    if (req.headers['content-length'] === '0') return Promise.resolve(Buffer.alloc(0));
    return Promise.reject(new TypeError('idem-pg: a body parser read the request body without keeping its bytes, '
      + 'which the fingerprint counts: give it verify: idem.rawBody (express.json({ verify: idem.rawBody }), '
      + 'express.urlencoded({ extended: false, verify: idem.rawBody }), ...)'));
  }
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      req.rawBody = Buffer.concat(chunks);
      resolve(req.rawBody);
    });
    req.on('error', reject);
  });
}

/** Per-route middleware: app.post('/orders', idem.express({ bizType: 'orders.create' }), handler). */
function expressMiddleware(idem, options) {
  const route = idem.route(options);
  return function idemMiddleware(req, res, next) {
    bodyBytes(req).then((body) => {
      const view = { method: req.method, path: req.originalUrl || req.url, headers: req.headers, body };
      return idem.begin(view, route, req);
    }).then((outcome) => {
      if (outcome.response) {
        req.idem = null;
        send(res, outcome.response);
        return;
      }
      req.idem = outcome.ctx;
      intercept(idem, outcome.ctx, res);
      idem.als.run(outcome.ctx, next);
    }, next);
  };
}

/**
 * An error handler to put after the routes: a transient database error
 * (40001, 40P01, 55P03, 57014, a lost connection) thrown by a handler
 * becomes 503 with Retry-After (the transaction rolls back: nothing is
 * stored, a retry runs again); other errors go on to the next handler.
 */
function expressErrorHandler(idem) {
  return function idemErrorHandler(err, req, res, next) {
    const ctx = req.idem;
    const route = ctx ? ctx.route : idem.defaults;
    const response = res.headersSent ? null : idem.responseForError(route, err);
    if (!response) return next(err);
    res.statusCode = response.status;
    for (const name of res.getHeaderNames()) res.removeHeader(name);
    for (const [k, v] of Object.entries(response.headers)) res.setHeader(k, v);
    res.end(response.body);
  };
}

module.exports = { expressMiddleware, expressErrorHandler, keepRawBody };
