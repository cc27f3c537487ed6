package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ReplayedHeader marks a replayed response (a common convention, not part
// of the IETF draft).
const ReplayedHeader = "Idempotent-Replayed"

// ExpiresHeader, on a replay: until when the key's stored response is kept
// (an HTTP-date); a retry after it runs the operation again (docs/http.md,
// "What is stored").
const ExpiresHeader = "Idempotent-Expires"

// DefaultProblemBase: a problem's "type" is this base followed by its slug,
// an anchor of docs/http.md's "Problem types". Set Config.ProblemBase to
// your API's own documentation.
const DefaultProblemBase = "https://github.com/idem-pg/idem/blob/main/docs/http.md#"

// Problems are the problem types the middleware answers with (docs/http.md,
// "Problem types"): slug -> status and title. The title is the type's;
// what differs from case to case is in "detail". None is ever stored.
var Problems = map[string]struct {
	Status int
	Title  string
}{
	"idempotency-key-missing": {400, "Idempotency-Key missing"},
	"idempotency-key-invalid": {400, "Idempotency-Key invalid"},
	"idempotency-key-reused":  {422, "Idempotency-Key reused for a different request"},
	"request-in-progress":     {409, "Request in progress"},
	"response-not-replayable": {422, "Stored response not replayable"},
	"transient-failure":       {503, "Transient failure"},
	"tenant-missing":          {500, "No tenant for this request"},
	"internal-error":          {500, "Response not stored"},
}

// TransientRefusals say nothing about the operation, only about this
// attempt: authentication (401, 407), authorization or CSRF (403), a
// timeout (408), too early (425), rate limiting (429). Never stored.
var TransientRefusals = map[int]bool{401: true, 403: true, 407: true, 408: true, 425: true, 429: true}

// DefaultStore: 2xx and 3xx are stored (idem_complete), the deterministic
// 4xx (400, 404, 409, 422, ...) as a business failure (idem_fail); never
// TransientRefusals or 5xx: those roll back, claim included, so that a
// retry runs the operation.
func DefaultStore(status int) bool {
	return !TransientRefusals[status] && status >= 200 && status < 500
}

// TxBeginner opens the transaction a request runs in: a *pgxpool.Pool.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config is how requests are made idempotent (docs/http.md, "The rules").
// The key's scope must be chosen: Tenant, or SingleTenant; New refuses
// neither.
type Config struct {
	// Pool opens each request's transaction (a *pgxpool.Pool). Behind
	// PgBouncer in transaction mode, connect with
	// default_query_exec_mode=exec (or simple_protocol).
	Pool TxBeginner
	// Tenant returns the authenticated caller's tenant (never from a
	// header the client chooses); "" is none. The claimed key is
	// "<UTF-8 length of tenant>:<tenant>:<key>", and the tenant is part of
	// the fingerprint.
	Tenant func(r *http.Request) string
	// SingleTenant: no tenant hook, every caller shares one key space
	// (claimed key "-:<key>").
	SingleTenant bool
	// Anonymous: with Tenant, a request whose hook returns "" is claimed
	// in the anonymous scope "-:<key>" instead of refused with 500.
	Anonymous bool
	// Header: default "Idempotency-Key".
	Header string
	// MinKeyLength, MaxKeyLength: default 16 and 255 characters.
	MinKeyLength, MaxKeyLength int
	// BareKeys also accepts an unquoted key (Idempotency-Key: abc...).
	BareKeys bool
	// NoWait: a duplicate of a request still running gets 409 at once,
	// instead of waiting for its outcome.
	NoWait bool
	// LockTimeout bounds a duplicate's wait (default 5 s; negative: the
	// session's lock_timeout). When it ends: 409 with Retry-After.
	LockTimeout time.Duration
	// RetryAfter: seconds, on 409 and 503 (default 1).
	RetryAfter int
	// StoredHeaders: response headers stored and replayed with status and
	// body (default Content-Type, Location).
	StoredHeaders []string
	// Store: which statuses are stored; the others roll back (default
	// DefaultStore).
	Store func(status int) bool
	// MaxStoredBody: larger bodies are sent but not stored; a replay has
	// the status and headers and an empty body (default 256 KiB).
	MaxStoredBody int
	// Fingerprint replaces RequestFingerprint: any string identifying the
	// request. body is the request's body, read whole.
	Fingerprint func(r *http.Request, body []byte) string
	// ExcludeFields: JSON fields (top-level names or dotted paths) left
	// out of every fingerprint.
	ExcludeFields []string
	// ProblemBase: default DefaultProblemBase.
	ProblemBase string
	// Phase is called at "before_commit" and "after_commit" of a request's
	// transaction (metrics, tracing; the project's tests kill the server
	// there).
	Phase func(phase string, r *http.Request)
	// ErrorLog: errors that are neither the caller's nor transient (a bug,
	// a missing extension); default log.Default().
	ErrorLog *log.Logger
}

// Middleware makes routes idempotent; see New and Route.
type Middleware struct{ cfg Config }

// New checks cfg and fills in its defaults. It refuses a Config that
// chooses no key scope: without a tenant, one caller could be replayed
// another's response.
func New(cfg Config) (*Middleware, error) {
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("idem.New: Config.Pool is required")
	case cfg.Tenant == nil && !cfg.SingleTenant:
		return nil, errors.New("idem.New: choose the key scope: Tenant (a function returning the " +
			"authenticated caller's tenant; keys of different tenants never meet), or SingleTenant: true " +
			"(every caller shares one key space). Without either, one caller could be replayed another's response")
	case cfg.Tenant != nil && cfg.SingleTenant:
		return nil, errors.New("idem.New: Tenant and SingleTenant exclude each other")
	case cfg.Anonymous && cfg.Tenant == nil:
		return nil, errors.New("idem.New: Anonymous needs a Tenant hook")
	}
	if cfg.Header == "" {
		cfg.Header = "Idempotency-Key"
	}
	if cfg.MinKeyLength == 0 {
		cfg.MinKeyLength = 16
	}
	if cfg.MaxKeyLength == 0 {
		cfg.MaxKeyLength = 255
	}
	if cfg.MinKeyLength < 1 || cfg.MinKeyLength > cfg.MaxKeyLength || cfg.MaxKeyLength > 255 {
		return nil, errors.New("idem.New: need 1 <= MinKeyLength <= MaxKeyLength <= 255")
	}
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = 5 * time.Second
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = 1
	}
	if cfg.StoredHeaders == nil {
		cfg.StoredHeaders = []string{"Content-Type", "Location"}
	}
	if cfg.Store == nil {
		cfg.Store = DefaultStore
	}
	if cfg.MaxStoredBody == 0 {
		cfg.MaxStoredBody = 256 * 1024
	}
	if cfg.ProblemBase == "" {
		cfg.ProblemBase = DefaultProblemBase
	}
	if cfg.ErrorLog == nil {
		cfg.ErrorLog = log.Default()
	}
	return &Middleware{cfg: cfg}, nil
}

var bizTypePattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)

type route struct {
	bizType       string
	keyOptional   bool
	wait          *bool
	ttl           time.Duration
	lockTimeout   time.Duration
	excludeFields []string
	store         func(int) bool
	anonymous     *bool
	lease         time.Duration
	retryAfter    int
}

// RouteOption changes one route's behaviour from the Config's.
type RouteOption func(*route)

// KeyOptional: a request without the header runs without idempotency (in
// a transaction all the same, committed if its status would be stored).
func KeyOptional() RouteOption { return func(r *route) { r.keyOptional = true } }

// Wait: whether a duplicate waits for the first request (Config.NoWait's opposite).
func Wait(wait bool) RouteOption { return func(r *route) { r.wait = &wait } }

// TTL: the claims' TTL (default idem_configure's, else idem.default_ttl).
func TTL(d time.Duration) RouteOption { return func(r *route) { r.ttl = d } }

// LockTimeout: this route's bound of a duplicate's wait.
func LockTimeout(d time.Duration) RouteOption { return func(r *route) { r.lockTimeout = d } }

// ExcludeFields: JSON fields left out of this route's fingerprints too.
func ExcludeFields(fields ...string) RouteOption {
	return func(r *route) { r.excludeFields = append(r.excludeFields, fields...) }
}

// StoreStatus: which statuses of this route are stored.
func StoreStatus(store func(status int) bool) RouteOption { return func(r *route) { r.store = store } }

// Anonymous: this route's Config.Anonymous.
func Anonymous(anonymous bool) RouteOption { return func(r *route) { r.anonymous = &anonymous } }

// Lease: lease mode, for handlers that call services outside the database
// (whole seconds, at least 1). The claim commits before the handler runs,
// with a lease of this length, so it outlives a crash of the process; the
// handler's writes and the stored response are a second transaction (Tx),
// the response stored with the lease token. A duplicate meanwhile gets 409
// at once; a handler that fails (an answer not stored, a panic, a lost
// process) leaves the lease to run out, and the next retry takes it over
// (ClaimOf: Attempt, RecoveryPoint, RecoveryData; record points with
// Checkpoint). Set the route's RetryAfter to about the lease.
func Lease(d time.Duration) RouteOption { return func(r *route) { r.lease = d } }

// RetryAfter: this route's Config.RetryAfter (seconds, on its 409 and 503).
func RetryAfter(seconds int) RouteOption { return func(r *route) { r.retryAfter = seconds } }

type ctxKey struct{}

type requestState struct {
	tx    pgx.Tx
	claim *ClaimResult
	pool  TxBeginner
}

// Tx is the transaction of the request being handled (the claim's), or
// nil outside a route of the middleware. Run the business writes in it;
// never Commit or Rollback it: the middleware does, after storing the
// response (with a *pgxpool.Pool, both return ErrTxOwned; the README's
// "Round trips to PostgreSQL").
func Tx(ctx context.Context) pgx.Tx {
	if s, ok := ctx.Value(ctxKey{}).(*requestState); ok {
		return s.tx
	}
	return nil
}

// ClaimOf is the request's claim (nil without a key, on an optional route).
func ClaimOf(ctx context.Context) *ClaimResult {
	if s, ok := ctx.Value(ctxKey{}).(*requestState); ok {
		return s.claim
	}
	return nil
}

// Checkpoint records a recovery point of the request's leased claim (a
// route with Lease) and renews the lease, committed at once in a
// transaction of its own: the request's may still roll back, and a retry
// that takes the lease over must find the point (ClaimOf(ctx).RecoveryPoint
// and RecoveryData) so as not to repeat the external call before it.
func Checkpoint(ctx context.Context, point string, data any) error {
	s, ok := ctx.Value(ctxKey{}).(*requestState)
	if !ok || s.claim == nil || s.claim.LeaseToken == "" {
		return errors.New("idem: Checkpoint needs a request on a route in lease mode")
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return &Error{Code: SQLState(err), Op: "idem_checkpoint", Err: err}
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := s.claim.Checkpoint(ctx, tx, point, data); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return &Error{Code: SQLState(err), Op: "idem_checkpoint", Err: err}
	}
	s.claim.RecoveryPoint = point
	s.claim.RecoveryData, _ = json.Marshal(data)
	return nil
}

// Route returns the middleware of one idempotent operation: bizType is
// idem's business type (one per endpoint or operation,
// ^[A-Za-z0-9_.:-]{1,64}$; it panics otherwise, at start-up). Wrap the
// endpoint's handler with it: net/http and chi directly, echo with
// echo.WrapMiddleware, gin with the adapter in the README.
func (m *Middleware) Route(bizType string, opts ...RouteOption) func(http.Handler) http.Handler {
	if !bizTypePattern.MatchString(bizType) {
		panic(fmt.Sprintf("idem: business type %q does not match %s", bizType, bizTypePattern))
	}
	rt := &route{bizType: bizType, retryAfter: m.cfg.RetryAfter}
	for _, o := range opts {
		o(rt)
	}
	if rt.lease != 0 && (rt.lease < time.Second || rt.lease%time.Second != 0) {
		panic(fmt.Sprintf("idem: route %s: the lease is whole seconds, at least 1 (got %s)", bizType, rt.lease))
	}
	if rt.retryAfter <= 0 {
		rt.retryAfter = m.cfg.RetryAfter
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(rt, next, w, r) })
	}
}

func (m *Middleware) problem(w http.ResponseWriter, slug, detail string, retryAfter int) {
	p := Problems[slug]
	body, _ := json.Marshal(map[string]any{"type": m.cfg.ProblemBase + slug, "title": p.Title, "status": p.Status, "detail": detail})
	w.Header().Set("Content-Type", "application/problem+json")
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

func (m *Middleware) unavailable(w http.ResponseWriter, err error, retryAfter int) {
	code := SQLState(err)
	if code == "" {
		code = "connection lost"
	}
	m.problem(w, "transient-failure", "A transient database failure ("+code+
		"); nothing was done, retry with the same Idempotency-Key.", retryAfter)
}

func (m *Middleware) inProgress(w http.ResponseWriter, rt *route) {
	m.problem(w, "request-in-progress",
		"A request with this Idempotency-Key is being processed; retry later with the same key.", rt.retryAfter)
}

// WriteError answers a handler's database error: 503 with Retry-After
// for a transient one (the transaction is lost: nothing is stored, the
// retry runs again), else 500. Either way the middleware rolls back.
func (m *Middleware) WriteError(w http.ResponseWriter, err error) {
	if IsTransient(err) {
		m.unavailable(w, err, m.cfg.RetryAfter)
		return
	}
	m.cfg.ErrorLog.Printf("idem: handler error: %v", err)
	http.Error(w, "internal server error", http.StatusInternalServerError)
}

// internal answers an error that is neither the caller's nor transient.
func (m *Middleware) internal(w http.ResponseWriter, r *http.Request, rt *route, err error) {
	if IsTransient(err) {
		m.unavailable(w, err, rt.retryAfter)
		return
	}
	m.cfg.ErrorLog.Printf("idem: %s %s (%s): %v", r.Method, r.URL.Path, rt.bizType, err)
	http.Error(w, "internal server error", http.StatusInternalServerError)
}

func (m *Middleware) anonymous(rt *route) bool {
	if rt.anonymous != nil {
		return *rt.anonymous
	}
	return m.cfg.Anonymous
}

// notStored answers a failure to store the response or to commit.
func (m *Middleware) notStored(w http.ResponseWriter, r *http.Request, rt *route, err error) {
	if IsTransient(err) {
		m.unavailable(w, err, rt.retryAfter)
		return
	}
	m.cfg.ErrorLog.Printf("idem: %s %s (%s): storing the response: %v", r.Method, r.URL.Path, rt.bizType, err)
	m.problem(w, "internal-error", "The response could not be stored; nothing was committed, or the outcome is unknown.", 0)
}

func (m *Middleware) serve(rt *route, next http.Handler, w http.ResponseWriter, r *http.Request) {
	store := m.cfg.Store
	if rt.store != nil {
		store = rt.store
	}
	fields := r.Header.Values(m.cfg.Header)
	if len(fields) == 0 {
		if rt.keyOptional {
			m.runUnclaimed(rt, store, next, w, r)
			return
		}
		m.problem(w, "idempotency-key-missing", fmt.Sprintf(`Send %s: "<key>", %d to %d visible ASCII characters, made once per intent.`,
			m.cfg.Header, m.cfg.MinKeyLength, m.cfg.MaxKeyLength), 0)
		return
	}
	// Field lines are combined with commas, as HTTP does: two lines are two values.
	key, why := ParseKeyField(strings.Join(fields, ", "), m.cfg.MinKeyLength, m.cfg.MaxKeyLength, m.cfg.BareKeys)
	if key == "" {
		m.problem(w, "idempotency-key-invalid", m.cfg.Header+": "+why+".", 0)
		return
	}
	scope := SharedScope
	if m.cfg.Tenant != nil {
		if tenant := m.cfg.Tenant(r); tenant != "" {
			scope = TenantScope(tenant)
		} else if !m.anonymous(rt) {
			m.cfg.ErrorLog.Printf("idem: the tenant hook returned no tenant for %s %s (route %s); answered 500. "+
				"Authenticate before this middleware, or allow anonymous callers (Anonymous).", r.Method, r.URL.Path, rt.bizType)
			m.problem(w, "tenant-missing", "The server found no tenant for this request; nothing was done.", 0)
			return
		}
	}
	scoped := ScopedKey(scope, key)
	if len(scoped) > 1024 { // idem refuses longer keys with 22023
		m.problem(w, "idempotency-key-invalid", m.cfg.Header+": the key with its tenant is over 1024 bytes.", 0)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "the request body could not be read", http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var fp string
	if m.cfg.Fingerprint != nil {
		fp = m.cfg.Fingerprint(r, body)
	} else {
		fp = RequestFingerprint(r.Method, r.URL.Path, r.URL.RawQuery, scope,
			body, append(append([]string{}, m.cfg.ExcludeFields...), rt.excludeFields...))
	}

	ctx := r.Context()
	wait := !m.cfg.NoWait
	if rt.wait != nil {
		wait = *rt.wait
	}
	lockTimeout := m.cfg.LockTimeout
	if rt.lockTimeout != 0 {
		lockTimeout = rt.lockTimeout
	}
	claimOpts := []ClaimOption{WithFingerprint(fp), WithWait(wait), WithTTL(rt.ttl), WithLockTimeout(lockTimeout)}
	if rt.lease > 0 {
		claimOpts = append(claimOpts, WithLease(rt.lease))
	}
	tx, c, err := m.beginClaim(ctx, scoped, rt.bizType, claimOpts...)
	if tx != nil {
		defer func() { tx.rollback(context.WithoutCancel(ctx)) }() // after a commit: a no-op
	}
	switch {
	case errors.Is(err, ErrLockTimeout):
		// The claim's own wait for the first request ran out: that one is
		// still in progress.
		m.inProgress(w, rt)
		return
	case errors.Is(err, ErrFingerprintMismatch):
		m.problem(w, "idempotency-key-reused", "This Idempotency-Key was first used for a different request; "+
			"do not retry this request, a new request needs a new key.", 0)
		return
	case err != nil:
		m.internal(w, r, rt, err)
		return
	}
	if !c.Claimed {
		tx.rollback(context.WithoutCancel(ctx))
		if c.State == StateInProgress {
			m.inProgress(w, rt)
			return
		}
		stored, ok := fromDocument(c.Result)
		if !ok {
			// Finished by other code without a response (docs/http.md,
			// "Finished by other code"): completed, 204 (done; other code's
			// result is not the client's to see); failed, 422.
			if c.State == StateCompleted {
				markReplay(w.Header(), c)
				w.WriteHeader(http.StatusNoContent)
				return
			}
			m.problem(w, "response-not-replayable", "The request with this Idempotency-Key failed, and no response "+
				"was stored for it; a new request needs a new key.", 0)
			return
		}
		for name, vs := range stored.header {
			w.Header()[name] = vs
		}
		markReplay(w.Header(), c)
		w.WriteHeader(stored.status)
		_, _ = w.Write(stored.body)
		return
	}

	if rt.lease > 0 {
		// Lease mode: the claim commits now, so that it outlives this
		// process and a takeover finds the recovery points; the handler's
		// writes and the stored response are a second transaction. (The
		// deferred rollback is of tx, whichever it is.) Failing from here
		// on leaves the lease to run out.
		second, err := m.commitAndBegin(ctx, tx)
		if err != nil {
			m.internal(w, r, rt, err)
			return
		}
		tx = second
		c.inTx(tx.tx)
	}
	// Lease mode: an answer that is not stored (5xx, a refusal that is not
	// kept, a failure to store, a panic) hands the lease back before the
	// answer goes out, so that the client's retry takes it over at once
	// instead of waiting for the lease to run out. Best effort: if it
	// fails, the lease runs out.
	handedBack := false
	handBack := func() {
		if rt.lease > 0 && !handedBack && c.Finished() == "" {
			handedBack = true
			tx.rollback(context.WithoutCancel(ctx))
			m.release(context.WithoutCancel(ctx), c)
		}
	}
	defer handBack() // (a panic)
	rec := m.run(next, r, &requestState{tx: tx.tx, claim: c, pool: m.cfg.Pool})
	if !store(rec.status) {
		tx.rollback(context.WithoutCancel(ctx))
		handBack()
		rec.send(w)
		return
	}
	doc := toDocument(rec.status, rec.header, rec.body.Bytes(), m.cfg.StoredHeaders, m.cfg.MaxStoredBody)
	storeErr, commitErr := m.storeAndCommit(ctx, r, tx, c, rec.status >= 400, doc)
	if storeErr != nil {
		handBack()
		m.notStored(w, r, rt, storeErr)
		return
	}
	if commitErr != nil {
		// (the outcome may be unknown: a retry replays it or runs again)
		m.notStored(w, r, rt, commitErr)
		return
	}
	if m.cfg.Phase != nil {
		m.cfg.Phase("after_commit", r)
	}
	rec.send(w)
}

// connAcquirer is a Pool that lends whole connections (a *pgxpool.Pool).
type connAcquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// reqTx is a request's transaction. With a connAcquirer, it runs on a
// connection the middleware holds: BEGIN travels with the claim, and the
// stored response with COMMIT (a pgx.Tx of the pool's sends BEGIN and
// COMMIT as queries of their own, and only its Commit or Rollback hands
// the connection back).
type reqTx struct {
	tx   pgx.Tx        // the handler's (Tx): a connTx on conn, or the Pool's
	conn *pgxpool.Conn // nil: tx is the Pool's
	done bool
}

// beginClaim opens the request's transaction and claims the key in it. It
// returns the transaction (to be rolled back) also with an error.
func (m *Middleware) beginClaim(ctx context.Context, key, bizType string, opts ...ClaimOption) (*reqTx, *ClaimResult, error) {
	pool, ok := m.cfg.Pool.(connAcquirer)
	if !ok {
		tx, err := m.begin(ctx)
		if err != nil {
			return nil, nil, err
		}
		c, err := Claim(ctx, tx.tx, key, bizType, opts...)
		return tx, c, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	tx := &reqTx{tx: &connTx{conn: conn.Conn()}, conn: conn}
	c, err := beginAndClaim(ctx, conn.Conn(), tx.tx, key, bizType, opts...)
	return tx, c, err
}

// begin opens a transaction of the Pool's.
func (m *Middleware) begin(ctx context.Context) (*reqTx, error) {
	tx, err := m.cfg.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &reqTx{tx: tx}, nil
}

// commitAndBegin commits tx and opens the next transaction (lease mode:
// the claim's, then the handler's): on the connection the middleware
// holds, one query (if the COMMIT fails, the BEGIN does not run).
func (m *Middleware) commitAndBegin(ctx context.Context, tx *reqTx) (*reqTx, error) {
	if tx.conn != nil {
		_, err := tx.conn.Exec(ctx, "COMMIT; BEGIN")
		return tx, err
	}
	if err := tx.commit(ctx); err != nil {
		return nil, err
	}
	return m.begin(ctx)
}

// rollback ends the transaction unless it has ended (a no-op then).
func (t *reqTx) rollback(ctx context.Context) {
	if t.done {
		return
	}
	t.done = true
	if t.conn == nil {
		_ = t.tx.Rollback(ctx)
		return
	}
	if t.conn.Conn().PgConn().TxStatus() != 'I' {
		_, _ = t.conn.Exec(ctx, "ROLLBACK")
	}
	t.hangUp()
}

func (t *reqTx) commit(ctx context.Context) error {
	t.done = true
	if t.conn == nil {
		return t.tx.Commit(ctx)
	}
	defer t.hangUp()
	tag, err := t.conn.Exec(ctx, "COMMIT")
	if err == nil && tag.String() == "ROLLBACK" { // (an aborted transaction)
		err = pgx.ErrTxCommitRollback
	}
	return err
}

// hangUp gives the connection back to the pool, which closes it if a
// transaction is still open on it.
func (t *reqTx) hangUp() {
	t.conn.Release()
	t.conn = nil
}

// connTx is the handler's pgx.Tx on the connection the middleware holds,
// in the transaction the middleware began. Commit and Rollback are the
// middleware's: here they fail. Begin (a savepoint) and LargeObjects go
// through a pgx.Tx of pgx's own made on the first call, which costs one
// round trip (a SELECT).
type connTx struct {
	conn *pgx.Conn
	pgx  pgx.Tx
}

// ErrTxOwned: Commit or Rollback of the request's transaction (Tx), which
// the middleware ends after storing the response.
var ErrTxOwned = errors.New("idem: the middleware commits or rolls back the request's transaction")

func (t *connTx) Commit(context.Context) error   { return ErrTxOwned }
func (t *connTx) Rollback(context.Context) error { return ErrTxOwned }
func (t *connTx) Conn() *pgx.Conn                { return t.conn }

func (t *connTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *connTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *connTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *connTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

func (t *connTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	return t.conn.CopyFrom(ctx, table, columns, rows)
}

func (t *connTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Prepare(ctx, name, sql)
}

func (t *connTx) Begin(ctx context.Context) (pgx.Tx, error) {
	inner, err := t.pgxTx(ctx)
	if err != nil {
		return nil, err
	}
	return inner.Begin(ctx)
}

// LargeObjects panics if the transaction has failed or the connection is
// lost (pgx gives no LargeObjects without a pgx.Tx of its own).
func (t *connTx) LargeObjects() pgx.LargeObjects {
	inner, err := t.pgxTx(context.Background())
	if err != nil {
		panic(fmt.Sprintf("idem: LargeObjects of the request's transaction: %v", err))
	}
	return inner.LargeObjects()
}

// pgxTx is a pgx.Tx of pgx's own in the open transaction: pgx begins one
// with a query of the caller's choice, here one that does nothing.
func (t *connTx) pgxTx(ctx context.Context) (pgx.Tx, error) {
	if t.pgx == nil {
		inner, err := t.conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: "SELECT"})
		if err != nil {
			return nil, err
		}
		t.pgx = inner
	}
	return t.pgx, nil
}

// storeAndCommit stores the response (idem_fail for a failure, else
// idem_complete) and commits. On a connection of the middleware's own and
// with no Phase hook to run between the two, one batch does both (one
// round trip; its COMMIT does not run if storing fails). storeErr: nothing
// was stored (the transaction rolls back); commitErr: the COMMIT failed,
// and the outcome may be unknown.
func (m *Middleware) storeAndCommit(ctx context.Context, r *http.Request, tx *reqTx, c *ClaimResult, failure bool, doc json.RawMessage) (storeErr, commitErr error) {
	if tx.conn != nil && m.cfg.Phase == nil {
		storeErr, commitErr := c.finishAndCommit(ctx, tx.conn.Conn(), failure, doc)
		if storeErr == nil && commitErr == nil {
			tx.done = true
			tx.hangUp()
		}
		return storeErr, commitErr
	}
	var err error
	if failure {
		err = c.Fail(ctx, doc)
	} else {
		err = c.Complete(ctx, doc)
	}
	if err != nil {
		return err, nil
	}
	if m.cfg.Phase != nil {
		m.cfg.Phase("before_commit", r)
	}
	return nil, tx.commit(ctx)
}

// markReplay sets the headers of a replay.
func markReplay(h http.Header, c *ClaimResult) {
	h.Set(ReplayedHeader, "true")
	if !c.ExpiresAt.IsZero() {
		h.Set(ExpiresHeader, c.ExpiresAt.UTC().Format(http.TimeFormat))
	}
}

// release hands a leased claim back (idem_release) in a transaction of its
// own: one statement outside a transaction when the Pool runs queries (a
// *pgxpool.Pool), else BEGIN, the statement, COMMIT.
func (m *Middleware) release(ctx context.Context, c *ClaimResult) {
	if pool, ok := m.cfg.Pool.(PgxQuerier); ok {
		if err := Release(ctx, pool, c.Key, c.BizType, c.LeaseToken); err != nil {
			m.cfg.ErrorLog.Printf("idem: handing back the lease of (%s, %s): %v", c.BizType, c.Key, err)
		}
		return
	}
	tx, err := m.cfg.Pool.Begin(ctx)
	if err == nil {
		defer func() { _ = tx.Rollback(ctx) }()
		if err = Release(ctx, tx, c.Key, c.BizType, c.LeaseToken); err == nil {
			err = tx.Commit(ctx)
		}
	}
	if err != nil {
		m.cfg.ErrorLog.Printf("idem: handing back the lease of (%s, %s): %v", c.BizType, c.Key, err)
	}
}

// runUnclaimed: an optional key, absent. The handler runs in a
// transaction all the same, committed if its answer would be stored.
func (m *Middleware) runUnclaimed(rt *route, store func(int) bool, next http.Handler, w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, err := m.cfg.Pool.Begin(ctx)
	if err != nil {
		m.internal(w, r, rt, err)
		return
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rec := m.run(next, r, &requestState{tx: tx, pool: m.cfg.Pool})
	if store(rec.status) {
		if err := tx.Commit(ctx); err != nil {
			m.internal(w, r, rt, err)
			return
		}
	}
	rec.send(w)
}

// run calls the handler with the transaction in the request's context and
// records its answer. A panic propagates (after the deferred rollback).
func (m *Middleware) run(next http.Handler, r *http.Request, s *requestState) *recorder {
	rec := &recorder{header: http.Header{}}
	next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), ctxKey{}, s)))
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return rec
}

// recorder buffers the handler's response: it is stored before COMMIT and
// sent after it. (It is no http.Flusher: a streamed response cannot be
// stored.)
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (rec *recorder) Header() http.Header { return rec.header }

func (rec *recorder) WriteHeader(status int) {
	if rec.status == 0 {
		rec.status = status
	}
}

func (rec *recorder) Write(b []byte) (int, error) {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return rec.body.Write(b)
}

func (rec *recorder) send(w http.ResponseWriter) {
	for name, vs := range rec.header {
		w.Header()[name] = vs
	}
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body.Bytes())
}
