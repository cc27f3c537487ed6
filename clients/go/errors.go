package idem

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATEs idem raises or that a caller of idem meets (the extension's
// README, "SQLSTATEs").
const (
	CodeFingerprintMismatch = "ID001" // a duplicate carries another fingerprint than the first claim
	CodeIllegalTransition   = "ID002" // idem_transition, guard triggers
	CodeNotHeld             = "ID003" // complete/fail/checkpoint on a claim the caller does not hold
	CodeSerializationFail   = "40001"
	CodeDeadlock            = "40P01"
	CodeLockNotAvailable    = "55P03" // lock_timeout, e.g. while waiting for a concurrent claim
	CodeQueryCanceled       = "57014" // statement_timeout
	CodeInvalidParameter    = "22023" // empty or over-long key, bad biz_type, ttl or lease out of range
	CodeNullValue           = "22004"
	CodeReadOnly            = "25006" // a claim on a hot standby or in a read-only transaction
	CodeNotInstalled        = "55000" // (also other prerequisite states; see the README)
	CodeInsufficientPriv    = "42501"
)

// Sentinels for errors.Is. An *Error matches the one its SQLSTATE falls under.
var (
	// ErrFingerprintMismatch: ID001. The key was first used for a different
	// request; nothing was written. Answer 422, do not retry.
	ErrFingerprintMismatch = errors.New("idem: the key was first used with another fingerprint (ID001)")
	// ErrNotHeld: ID003. Complete, Fail or Checkpoint on a claim this
	// transaction did not make (or a lease whose token was not passed, or
	// was taken over).
	ErrNotHeld = errors.New("idem: the claim is not held by this caller (ID003)")
	// ErrLockTimeout: 55P03. The wait for a concurrent claim (or another
	// lock) ran out of lock_timeout. Transient too.
	ErrLockTimeout = errors.New("idem: lock_timeout (55P03)")
	// ErrTransient: 40001, 40P01, 55P03, 57014, 57P01-57P03, 53300, class 08
	// or a lost connection. The transaction rolled back, the claim with it;
	// a retry with the same key runs the operation again. Answer 503.
	ErrTransient = errors.New("idem: transient database failure")
)

// Error is a database error met by this package's calls, with its SQLSTATE
// ("" for a lost connection, which has none).
type Error struct {
	Code string // SQLSTATE
	Op   string // the idem function called: idem_claim, idem_complete, ...
	Err  error  // the driver's error
}

func (e *Error) Error() string {
	if e.Code == "" {
		return "idem: " + e.Op + ": " + e.Err.Error()
	}
	return "idem: " + e.Op + ": " + e.Err.Error() + " (SQLSTATE " + e.Code + ")"
}

func (e *Error) Unwrap() error { return e.Err }

// Is matches the sentinel of the error's SQLSTATE.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrFingerprintMismatch:
		return e.Code == CodeFingerprintMismatch
	case ErrNotHeld:
		return e.Code == CodeNotHeld
	case ErrLockTimeout:
		return e.Code == CodeLockNotAvailable
	case ErrTransient:
		return IsTransient(e.Err)
	}
	return false
}

// SQLState is the SQLSTATE of a database error (pgx's *pgconn.PgError, or
// any driver's error with a SQLState() method, such as lib/pq's), also
// when wrapped; "" if it has none.
func SQLState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return st.SQLState()
	}
	return ""
}

var transientCodes = map[string]bool{
	CodeSerializationFail: true, CodeDeadlock: true, CodeLockNotAvailable: true, CodeQueryCanceled: true,
	"57P01": true, "57P02": true, "57P03": true, // the server shuts down, crashed, or is starting
	"53300": true, // too_many_connections
}

// IsTransient is true for a failure that a retry with the same key may
// cure: the SQLSTATEs of ErrTransient, and a connection lost or refused.
// A context cancelled by the client is not: nothing is to be retried.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	if code := SQLState(err); code != "" {
		return transientCodes[code] || (len(code) == 5 && code[:2] == "08")
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) || isClosedConn(err)
}

// pgx reports a statement on a connection that broke earlier as "conn closed".
func isClosedConn(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == "conn closed" {
			return true
		}
	}
	return false
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var ie *Error
	if errors.As(err, &ie) {
		return err
	}
	return &Error{Code: SQLState(err), Op: op, Err: err}
}
