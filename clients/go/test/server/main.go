// The test server of tests/scenarios/clients.sh middleware_go: the idem middleware
// on one pgx pool, behind the router named by -router (net/http's
// ServeMux, chi, echo or gin), with the routes of the conformance table
// (tests/middleware/README.md, "The server a runner needs") and the
// test-only kill points.
//
// Environment: IDEM_TEST_DSN (the pool's connection string: the cluster's
// socket, or PgBouncer), IDEM_TEST_ADDR (host:port to listen on),
// IDEM_TEST_PROBLEM_BASE, IDEM_TEST_SIGNAL (a FIFO: a request with header
// X-Test-Pause: before_commit / after_commit writes "<phase>\n" to it
// when it reaches that point, then blocks until the server is killed).
// It prints "listening" once it accepts connections.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	idem "github.com/idem-pg/idem/clients/go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
)

// killPoint: signal the test, then block until it kills the process.
func killPoint(phase string, r *http.Request) { pause(phase, r.Header) }

func pause(phase string, h http.Header) {
	if h.Get("X-Test-Pause") != phase {
		return
	}
	f, err := os.OpenFile(os.Getenv("IDEM_TEST_SIGNAL"), os.O_WRONLY, 0)
	if err != nil {
		log.Fatalf("kill point: %v", err)
	}
	fmt.Fprintln(f, phase)
	f.Close()
	select {}
}

// The routes: path -> business type and options.
type routeSpec struct {
	path, bizType string
	opts          []idem.RouteOption
	killPoints    bool // the Phase hook: the response stored and COMMIT in two round trips
}

var routes = []routeSpec{
	{"/conformance/orders", "conformance.orders", nil, false},
	{"/conformance/orders-nowait", "conformance.nowait", []idem.RouteOption{idem.Wait(false)}, false},
	{"/conformance/orders-short-wait", "conformance.shortwait", []idem.RouteOption{idem.LockTimeout(200 * time.Millisecond)}, false},
	{"/conformance/orders-anonymous", "conformance.anonymous", []idem.RouteOption{idem.Anonymous(true)}, false},
	{"/conformance/orders-2xx-only", "conformance.only2xx",
		[]idem.RouteOption{idem.StoreStatus(func(s int) bool { return s >= 200 && s < 300 })}, false},
	{"/conformance/orders-lease", "conformance.lease", []idem.RouteOption{idem.Lease(60 * time.Second)}, false},
	// The runner configures conformance.retry with on_failure => 'retry'.
	{"/conformance/orders-retry", "conformance.retry", nil, false},
	// The lease takeover test's: a lease that runs out soon after the
	// server is killed.
	{"/charges", "charges.create", []idem.RouteOption{idem.Lease(time.Second)}, false},
	// The concurrency and kill tests': duplicates wait as long as the test
	// holds the first request (its own bound, not the verdict).
	{"/orders", "orders.create", []idem.RouteOption{idem.LockTimeout(2 * time.Minute)}, true},
}

// answer is what the business handler decided; each framework renders it
// its own way.
type answer struct {
	status  int
	id      int64
	attempt int
	pad     int // X-Conformance-Pad: that many bytes more in the body
	err     error

	// told: the claim's attempt and the status of the error the previous
	// attempt stored (0: none), which the conformance table checks.
	told, previousStatus int
}

// body is the answer's JSON body: {"id": ...}, and with X-Conformance-Pad a
// member "pad" that makes it as large as that.
func (a answer) body() map[string]any {
	b := map[string]any{"id": a.id}
	if a.pad > 0 {
		b["pad"] = strings.Repeat("x", a.pad)
	}
	return b
}

// pool: the server's, for the stand-in of an external call.
var pool *pgxpool.Pool

// business is the handler of every route, on the middleware's transaction.
func business(ctx context.Context, tx pgx.Tx, h http.Header, body []byte) answer {
	var in struct {
		Run string `json:"run"`
	}
	if strings.HasPrefix(h.Get("Content-Type"), "application/x-www-form-urlencoded") {
		form, _ := url.ParseQuery(string(body))
		in.Run = form.Get("run")
	} else if json.Unmarshal(body, &in) != nil {
		in.Run = ""
	}
	if in.Run == "" {
		return answer{status: http.StatusBadRequest}
	}
	a := answer{status: http.StatusCreated}
	if c := idem.ClaimOf(ctx); c != nil && c.LeaseToken != "" {
		a.attempt = c.Attempt
	}
	if c := idem.ClaimOf(ctx); c != nil && c.Claimed {
		a.told = c.Attempt
		var r struct {
			PreviousError struct {
				Status int `json:"status"`
			} `json:"previous_error"`
		}
		if c.Result != nil && json.Unmarshal(c.Result, &r) == nil {
			a.previousStatus = r.PreviousError.Status
		}
	}
	if c := idem.ClaimOf(ctx); c != nil && c.LeaseToken != "" && h.Get("X-Test-External") != "" {
		// Lease mode's use: a call outside the database (here a row
		// committed on its own, tenant 'external'), recorded by a
		// checkpoint; an attempt that takes the lease over resumes after
		// it and does not call again.
		if c.RecoveryPoint != "called" {
			if _, err := pool.Exec(ctx, "INSERT INTO conformance_rows (run, tenant, status) VALUES ($1, 'external', 0)", in.Run); err != nil {
				return answer{err: err}
			}
			if err := idem.Checkpoint(ctx, "called", map[string]string{"run": in.Run}); err != nil {
				return answer{err: err}
			}
		}
		pause("after_checkpoint", h)
	}
	if hold := h.Get("X-Conformance-Hold"); hold != "" {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", hold); err != nil {
			return answer{err: err}
		}
	}
	if s := h.Get("X-Conformance-Status"); s != "" {
		a.status, _ = strconv.Atoi(s)
	}
	a.pad, _ = strconv.Atoi(h.Get("X-Conformance-Pad"))
	var tenant *string
	if t := h.Get("X-Tenant"); t != "" {
		tenant = &t
	}
	insert := func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "INSERT INTO conformance_rows (run, tenant, status) VALUES ($1, $2, $3) RETURNING id",
			in.Run, tenant, a.status).Scan(&a.id)
	}
	if h.Get("X-Test-Savepoint") != "" {
		// A handler's own savepoint, and an attempt to commit the request's
		// transaction, which is the middleware's to end.
		if err := tx.Commit(ctx); !errors.Is(err, idem.ErrTxOwned) {
			return answer{err: fmt.Errorf("Commit of idem.Tx: %v", err)}
		}
		if err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			if _, err := sp.Exec(ctx, "INSERT INTO conformance_rows (run, tenant, status) VALUES ($1, 'savepoint', 0)", in.Run); err != nil {
				return err
			}
			return errors.New("rolled back to the savepoint")
		}); err == nil {
			return answer{err: errors.New("BeginFunc kept a failed savepoint")}
		}
		if err := pgx.BeginFunc(ctx, tx, insert); err != nil {
			return answer{err: err}
		}
	} else if err := insert(tx); err != nil {
		return answer{err: err}
	}
	if code := h.Get("X-Conformance-Fail"); code != "" {
		if _, err := tx.Exec(ctx, "SELECT raise_sqlstate($1)", code); err != nil {
			return answer{err: err}
		}
	}
	return a
}

func (a answer) headers(h http.Header) {
	h.Set("Location", "/conformance/rows/"+strconv.FormatInt(a.id, 10))
	h.Set("X-Conformance-Row", strconv.FormatInt(a.id, 10))
	if a.attempt > 0 {
		h.Set("X-Attempt", strconv.Itoa(a.attempt))
	}
	if a.told > 0 {
		h.Set("X-Conformance-Attempt", strconv.Itoa(a.told))
	}
	if a.previousStatus > 0 {
		h.Set("X-Conformance-Previous-Status", strconv.Itoa(a.previousStatus))
	}
}

func main() {
	router := flag.String("router", "nethttp", "nethttp, chi, echo or gin")
	flag.Parse()
	var err error
	pool, err = pgxpool.New(context.Background(), os.Getenv("IDEM_TEST_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	cfg := idem.Config{
		Pool:        pool,
		Tenant:      func(r *http.Request) string { return r.Header.Get("X-Tenant") }, // stands in for authentication
		ProblemBase: os.Getenv("IDEM_TEST_PROBLEM_BASE"),
	}
	plain, err := idem.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	cfg.Phase = killPoint
	withKillPoints, err := idem.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	route := func(rt routeSpec) func(http.Handler) http.Handler {
		if rt.killPoints {
			return withKillPoints.Route(rt.bizType, rt.opts...)
		}
		return plain.Route(rt.bizType, rt.opts...)
	}
	mw := plain // (WriteError)
	var handler http.Handler
	switch *router {
	case "nethttp":
		mux := http.NewServeMux()
		for _, rt := range routes {
			mux.Handle("POST "+rt.path, route(rt)(plainHandler(mw)))
		}
		handler = mux
	case "chi":
		r := chi.NewRouter()
		for _, rt := range routes {
			r.With(route(rt)).Post(rt.path, plainHandler(mw))
		}
		handler = r
	case "echo":
		e := echo.New()
		e.HideBanner, e.HidePort = true, true
		for _, rt := range routes {
			e.POST(rt.path, echoHandler(mw), echo.WrapMiddleware(route(rt)))
		}
		handler = e
	case "gin":
		gin.SetMode(gin.ReleaseMode)
		g := gin.New()
		for _, rt := range routes {
			g.POST(rt.path, GinMiddleware(route(rt)), ginHandler(mw))
		}
		handler = g
	default:
		log.Fatalf("unknown router %s", *router)
	}
	ln, err := net.Listen("tcp", os.Getenv("IDEM_TEST_ADDR"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("listening")
	log.Fatal(http.Serve(ln, handler))
}

// net/http and chi: a plain http.HandlerFunc.
func plainHandler(mw *idem.Middleware) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		a := business(r.Context(), idem.Tx(r.Context()), r.Header, body)
		if a.err != nil {
			mw.WriteError(w, a.err) // 503 for a transient failure; rolled back either way
			return
		}
		if a.status == http.StatusBadRequest && a.id == 0 {
			http.Error(w, "a JSON body with a run is required", http.StatusBadRequest)
			return
		}
		a.headers(w.Header())
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_ = json.NewEncoder(w).Encode(a.body())
	}
}

// echo: an echo.HandlerFunc; the middleware's transaction is in the
// request's context.
func echoHandler(mw *idem.Middleware) echo.HandlerFunc {
	return func(c echo.Context) error {
		body, _ := io.ReadAll(c.Request().Body)
		a := business(c.Request().Context(), idem.Tx(c.Request().Context()), c.Request().Header, body)
		if a.err != nil {
			mw.WriteError(c.Response(), a.err)
			return nil
		}
		if a.status == http.StatusBadRequest && a.id == 0 {
			return c.String(http.StatusBadRequest, "a JSON body with a run is required")
		}
		a.headers(c.Response().Header())
		return c.JSON(a.status, a.body())
	}
}

// gin: a gin.HandlerFunc.
func ginHandler(mw *idem.Middleware) gin.HandlerFunc {
	return func(c *gin.Context) {
		body, _ := io.ReadAll(c.Request.Body)
		a := business(c.Request.Context(), idem.Tx(c.Request.Context()), c.Request.Header, body)
		if a.err != nil {
			mw.WriteError(c.Writer, a.err)
			return
		}
		if a.status == http.StatusBadRequest && a.id == 0 {
			c.String(http.StatusBadRequest, "a JSON body with a run is required")
			return
		}
		a.headers(c.Writer.Header())
		c.JSON(a.status, a.body())
	}
}
