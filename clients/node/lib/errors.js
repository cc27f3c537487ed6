'use strict';
// Which database errors are transient: the transaction rolled back (the
// claim with it), and the same request, retried with the same key, runs the
// operation again. They answer 503 with Retry-After, never a stored failure.

const TRANSIENT_SQLSTATES = new Set([
  '40001', // serialization_failure
  '40P01', // deadlock_detected
  '55P03', // lock_not_available (lock_timeout while waiting for a concurrent claim)
  '57014', // query_canceled (statement_timeout)
  '57P01', '57P02', '57P03', // the server shuts down, crashed, or is starting
  '53300', // too_many_connections
]);

// Errors of the connection itself rather than of a statement.
const CONNECTION_CODES = new Set(['ECONNRESET', 'ECONNREFUSED', 'EPIPE', 'ETIMEDOUT', 'ENOTFOUND', 'EHOSTUNREACH']);

function isConnectionError(err) {
  if (!err) return false;
  const code = typeof err.code === 'string' ? err.code : '';
  if (code.startsWith('08') || CONNECTION_CODES.has(code)) return true;
  // node-postgres reports a lost connection without a SQLSTATE.
  return !code && /Connection terminated|connection is closed|Client has encountered a connection error|timeout exceeded when trying to connect/i
    .test(String(err.message || ''));
}

function isTransient(err) {
  if (!err) return false;
  return TRANSIENT_SQLSTATES.has(err.code) || isConnectionError(err);
}

module.exports = { TRANSIENT_SQLSTATES, isTransient, isConnectionError };
