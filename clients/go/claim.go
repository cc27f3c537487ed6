package idem

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// State is a claim's state as idem_claim returns it.
type State string

const (
	StateNew        State = "new"         // claimed: you are the first live arrival, do the work
	StateInProgress State = "in_progress" // another transaction holds it (wait off), or a lease runs
	StateCompleted  State = "completed"   // committed; Result is what idem_complete stored (or null)
	StateFailed     State = "failed"      // committed with idem_fail; Result is the error
)

// PgxQuerier is what Claim, Complete and Fail accept from pgx v5: pgx.Tx,
// *pgx.Conn, *pgxpool.Conn, *pgxpool.Tx.
type PgxQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SQLQuerier is what they accept from database/sql: *sql.Tx, *sql.Conn.
type SQLQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// ErrUnsupportedTx: the tx given is neither a PgxQuerier nor a SQLQuerier.
var ErrUnsupportedTx = errors.New("idem: tx must be a pgx.Tx (or another PgxQuerier) or a *sql.Tx (or another SQLQuerier)")

func queryRow(ctx context.Context, tx any, query string, args ...any) (interface{ Scan(...any) error }, error) {
	switch q := tx.(type) {
	case PgxQuerier:
		return q.QueryRow(ctx, query, args...), nil
	case SQLQuerier:
		return q.QueryRowContext(ctx, query, args...), nil
	}
	return nil, ErrUnsupportedTx
}

// ClaimResult is what idem_claim answered (its idem_claim_result), and the handle to finish the claim.
type ClaimResult struct {
	Key     string
	BizType string
	// Claimed: this transaction made the claim (State is StateNew): do the
	// work, then Complete or Fail before COMMIT.
	Claimed bool
	State   State
	// Result: the stored outcome for StateCompleted / StateFailed (nil if
	// none was stored); claimed, what idem_claim tells the new attempt:
	// after a lease takeover, the lease document; after a failure the
	// business type retries (idem_configure's on_failure 'retry'),
	// {attempt, previous_error}.
	Result         json.RawMessage
	FirstClaimedAt time.Time
	ExpiresAt      time.Time
	// LeaseToken: lease mode only (WithLease), from Result; Complete, Fail
	// and Checkpoint pass it.
	LeaseToken string
	// Claimed: Attempt is 1 for a first claim, 2, 3, ... after a lease
	// that ran out was taken over or a stored failure is retried (the
	// type's on_failure 'retry'); RecoveryPoint and RecoveryData
	// are the last Checkpoint of an earlier attempt ("" and nil: none), so
	// the work resumes there instead of repeating an external call.
	Attempt       int
	RecoveryPoint string
	RecoveryData  json.RawMessage

	tx       any
	finished State
}

// Decode unmarshals Result into v.
func (c *ClaimResult) Decode(v any) error {
	if c.Result == nil {
		return errors.New("idem: the claim has no stored result")
	}
	return json.Unmarshal(c.Result, v)
}

type claimConfig struct {
	ttl         time.Duration
	fingerprint *string
	wait        bool
	lease       time.Duration
	lockTimeout time.Duration
}

// ClaimOption sets one of idem_claim's optional arguments.
type ClaimOption func(*claimConfig)

// WithTTL: the claim's TTL (1 s to 400 days); default idem_configure's, else idem.default_ttl.
func WithTTL(d time.Duration) ClaimOption { return func(c *claimConfig) { c.ttl = d } }

// WithFingerprint: a string identifying the request; a later claim of the
// key with another one fails with ErrFingerprintMismatch (ID001).
func WithFingerprint(fp string) ClaimOption { return func(c *claimConfig) { c.fingerprint = &fp } }

// WithWait(false): a duplicate of an uncommitted claim gets StateInProgress
// at once instead of waiting for the first transaction's outcome.
func WithWait(wait bool) ClaimOption { return func(c *claimConfig) { c.wait = wait } }

// WithLease: lease mode, for work outside the database (the claim commits
// first; Result holds the lease token; see the README's "Leases").
func WithLease(d time.Duration) ClaimOption { return func(c *claimConfig) { c.lease = d } }

// WithLockTimeout bounds the wait for a concurrent claim (SET LOCAL
// lock_timeout around the claim only; the session's value is restored
// after it). Past it: an *Error with ErrLockTimeout.
func WithLockTimeout(d time.Duration) ClaimOption { return func(c *claimConfig) { c.lockTimeout = d } }

const claimSQL = `SELECT claimed, state, result::text, first_claimed_at, expires_at
  FROM idem_claim($1, $2, ttl => make_interval(secs => $3), fingerprint => $4, wait => $5,
                  lease => make_interval(secs => $6))`

// claimBoundedSQL: the claim with its wait bounded by lock_timeout, in one
// round trip. The CTE runs first (the claim's key comes from it) and makes
// the setting transaction-local; the select list, evaluated on the claim's
// row, restores it, so the caller's own lock waits keep the session's
// setting. Nothing outlives the transaction (PgBouncer-safe).
const claimBoundedSQL = `WITH s AS MATERIALIZED (
    SELECT $1::text AS k, current_setting('lock_timeout') AS prev, set_config('lock_timeout', $7, true) AS bound)
SELECT c.claimed, c.state, c.result::text, c.first_claimed_at, c.expires_at, set_config('lock_timeout', s.prev, true)
  FROM s, LATERAL idem_claim(s.k, $2, ttl => make_interval(secs => $3), fingerprint => $4, wait => $5,
                             lease => make_interval(secs => $6)) c`

func seconds(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return d.Seconds()
}

// Claim claims (bizType, key) in the transaction tx (a pgx.Tx or a
// *sql.Tx; see PgxQuerier and SQLQuerier). Errors are *Error values with
// the SQLSTATE: errors.Is(err, ErrFingerprintMismatch) (ID001, answer 422),
// errors.Is(err, ErrTransient) (40001, 40P01, 55P03, 57014, a lost
// connection: the transaction is lost, retry it).
func Claim(ctx context.Context, tx any, key, bizType string, opts ...ClaimOption) (*ClaimResult, error) {
	cfg, query, args := claimQuery(opts)
	row, err := queryRow(ctx, tx, query, append([]any{key, bizType}, args...)...)
	if err != nil {
		return nil, err
	}
	return scanClaim(row, cfg, &ClaimResult{Key: key, BizType: bizType, tx: tx})
}

// claimQuery is the claim's statement and its arguments after the key and
// the business type.
func claimQuery(opts []ClaimOption) (claimConfig, string, []any) {
	cfg := claimConfig{wait: true}
	for _, o := range opts {
		o(&cfg)
	}
	query, args := claimSQL, []any{seconds(cfg.ttl), cfg.fingerprint, cfg.wait, seconds(cfg.lease)}
	if cfg.lockTimeout > 0 {
		query = claimBoundedSQL
		args = append(args, fmt.Sprintf("%dms", max(cfg.lockTimeout.Milliseconds(), 1)))
	}
	return cfg, query, args
}

// beginAndClaim sends BEGIN and the claim as one batch on conn (pgx
// pipelines it: one round trip, the claim a prepared statement as any
// other), which must be outside a transaction; the transaction stays open
// on conn, aborted if the claim failed. pgx.Tx sends its BEGIN as a round
// trip of its own; the handler then gets the transaction as a connTx.
func beginAndClaim(ctx context.Context, conn *pgx.Conn, tx any, key, bizType string, opts ...ClaimOption) (*ClaimResult, error) {
	cfg, query, args := claimQuery(opts)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(query, append([]any{key, bizType}, args...)...)
	br := conn.SendBatch(ctx, b)
	var c *ClaimResult
	_, err := br.Exec() // BEGIN's
	if err == nil {
		c, err = scanClaim(br.QueryRow(), cfg, &ClaimResult{Key: key, BizType: bizType, tx: tx})
	}
	if closeErr := br.Close(); err == nil && closeErr != nil {
		err = closeErr
	}
	return c, wrap("idem_claim", err)
}

// scanClaim reads the claim's row into c.
func scanClaim(row interface{ Scan(...any) error }, cfg claimConfig, c *ClaimResult) (*ClaimResult, error) {
	var state string
	var result sql.NullString
	var first, expires sql.NullTime
	var restored sql.NullString
	dest := []any{&c.Claimed, &state, &result, &first, &expires}
	if cfg.lockTimeout > 0 {
		dest = append(dest, &restored)
	}
	if err := row.Scan(dest...); err != nil {
		return nil, wrap("idem_claim", err)
	}
	c.State, c.FirstClaimedAt, c.ExpiresAt = State(state), first.Time, expires.Time
	if result.Valid {
		c.Result = json.RawMessage(result.String)
	}
	if c.Claimed {
		c.Attempt = 1
	}
	if c.Claimed && c.Result != nil {
		var l struct {
			Token         string          `json:"lease_token"`
			Attempt       int             `json:"attempt"`
			RecoveryPoint *string         `json:"recovery_point"`
			RecoveryData  json.RawMessage `json:"recovery_data"`
		}
		if json.Unmarshal(c.Result, &l) == nil {
			c.Attempt = max(l.Attempt, 1)
			if cfg.lease > 0 {
				c.LeaseToken = l.Token
			}
			if l.RecoveryPoint != nil {
				c.RecoveryPoint = *l.RecoveryPoint
			}
			if len(l.RecoveryData) > 0 && string(l.RecoveryData) != "null" {
				c.RecoveryData = l.RecoveryData
			}
		}
	}
	return c, nil
}

// Complete stores the outcome of the claim (idem_complete) in its
// transaction; duplicates get it back. result is marshalled to JSON
// (json.RawMessage and []byte are taken as JSON text as they are).
func (c *ClaimResult) Complete(ctx context.Context, result any) error {
	if err := c.finishable("Complete"); err != nil {
		return err
	}
	if err := Complete(ctx, c.tx, c.Key, c.BizType, result, c.LeaseToken); err != nil {
		return err
	}
	c.finished = StateCompleted
	return nil
}

// Fail stores a deterministic business failure (idem_fail); duplicates get
// it back with StateFailed.
func (c *ClaimResult) Fail(ctx context.Context, errDoc any) error {
	if err := c.finishable("Fail"); err != nil {
		return err
	}
	if err := Fail(ctx, c.tx, c.Key, c.BizType, errDoc, c.LeaseToken); err != nil {
		return err
	}
	c.finished = StateFailed
	return nil
}

// Checkpoint records a recovery point of a leased claim (idem_checkpoint)
// in tx (nil: the claim's), renewing the lease. It counts once tx commits.
func (c *ClaimResult) Checkpoint(ctx context.Context, tx any, point string, data any) error {
	if c.LeaseToken == "" {
		return errors.New("idem: Checkpoint needs a claim made WithLease")
	}
	if tx == nil {
		tx = c.tx
	}
	return call(ctx, tx, "idem_checkpoint", `SELECT idem_checkpoint($1, $2, $3, $4::jsonb, $5)::text`,
		c.Key, c.BizType, point, data, c.LeaseToken)
}

// inTx: the claim finished (Complete, Fail) in another transaction than
// the one that made it: lease mode, where the claim commits first.
func (c *ClaimResult) inTx(tx any) { c.tx = tx }

// Finished is StateCompleted or StateFailed after Complete or Fail, else "".
func (c *ClaimResult) Finished() State { return c.finished }

func (c *ClaimResult) finishable(what string) error {
	if !c.Claimed {
		return fmt.Errorf("idem: %s on a claim this transaction did not make (state %s)", what, c.State)
	}
	if c.finished != "" {
		return fmt.Errorf("idem: %s on a claim already %s", what, c.finished)
	}
	return nil
}

// Complete calls idem_complete(key, bizType, result, leaseToken) in tx;
// leaseToken "" passes NULL.
func Complete(ctx context.Context, tx any, key, bizType string, result any, leaseToken string) error {
	return call(ctx, tx, "idem_complete", `SELECT idem_complete($1, $2, $3::jsonb, $4)::text`,
		key, bizType, result, leaseToken)
}

// Release calls idem_release(key, bizType, leaseToken) in tx: the holder of
// a lease hands it back early after a transient failure, so that the next
// claim takes it over at once (attempt + 1, the recovery point kept).
func Release(ctx context.Context, tx any, key, bizType, leaseToken string) error {
	row, err := queryRow(ctx, tx, `SELECT idem_release($1, $2, $3)::text`, key, bizType, leaseToken)
	if err != nil {
		return err
	}
	var ignored sql.NullString
	return wrap("idem_release", row.Scan(&ignored))
}

// Fail calls idem_fail(key, bizType, errDoc, leaseToken) in tx.
func Fail(ctx context.Context, tx any, key, bizType string, errDoc any, leaseToken string) error {
	return call(ctx, tx, "idem_fail", `SELECT idem_fail($1, $2, $3::jsonb, $4)::text`,
		key, bizType, errDoc, leaseToken)
}

// finishAndCommit is Complete (failure false) or Fail of the claim
// followed by COMMIT, as one batch on conn (one round trip). If the
// function fails, the COMMIT does not run and the transaction stays
// aborted. storeErr: nothing was stored; commitErr: the COMMIT failed.
func (c *ClaimResult) finishAndCommit(ctx context.Context, conn *pgx.Conn, failure bool, doc any) (storeErr, commitErr error) {
	op, state := "idem_complete", StateCompleted
	if failure {
		op, state = "idem_fail", StateFailed
	}
	if err := c.finishable(op); err != nil {
		return err, nil
	}
	text, err := jsonText(doc)
	if err != nil {
		return err, nil
	}
	var token any
	if c.LeaseToken != "" {
		token = c.LeaseToken
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT `+op+`($1, $2, $3::jsonb, $4)::text`, c.Key, c.BizType, text, token)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	var ignored sql.NullString
	storeErr = br.QueryRow().Scan(&ignored)
	if storeErr == nil {
		_, commitErr = br.Exec()
	}
	if err := br.Close(); storeErr == nil && commitErr == nil {
		commitErr = err
	}
	if storeErr != nil {
		return wrap(op, storeErr), nil
	}
	if commitErr == nil {
		c.finished = state
	}
	return nil, commitErr
}

// call runs one finishing function; the document (the argument before the
// last) goes as JSON text, the token as NULL when empty.
func call(ctx context.Context, tx any, op, query string, args ...any) error {
	doc, err := jsonText(args[len(args)-2])
	if err != nil {
		return err
	}
	args[len(args)-2] = doc
	if args[len(args)-1] == "" {
		args[len(args)-1] = nil
	}
	row, err := queryRow(ctx, tx, query, args...)
	if err != nil {
		return err
	}
	var ignored sql.NullString
	return wrap(op, row.Scan(&ignored))
}

func jsonText(v any) (any, error) {
	switch d := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		return string(d), nil
	case []byte:
		return string(d), nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("idem: the result is not JSON: %w", err)
	}
	return string(b), nil
}
