package main_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
)

const duplicates = 20

func (s *server) order(route, key, run string, extra map[string]string) *http.Request {
	req, _ := http.NewRequest(http.MethodPost, s.base+route, strings.NewReader(fmt.Sprintf(`{"run":%q,"sku":"sku-1","qty":2}`, run)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	req.Header.Set("X-Tenant", "acme")
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	return req
}

// holdLock takes the advisory lock the requests with X-Conformance-Hold: u
// wait for, on a connection of its own; the returned func releases it.
func holdLock(t *testing.T, u string) func() {
	conn, err := checkDB.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), "SELECT pg_advisory_lock(hashtext($1))", u); err != nil {
		t.Fatal(err)
	}
	return func() {
		conn.Exec(context.Background(), "SELECT pg_advisory_unlock(hashtext($1))", u)
		conn.Release()
	}
}

// 20 identical requests at once, duplicates waiting: the first is held in
// its handler until pg_stat_activity shows the 19 others waiting in
// idem_claim; then one business row, 20 identical 201s, 19 replayed.
func concurrentWait(t *testing.T, s *server) {
	u := runID()
	key := u + "-concurrent-wait"
	release := holdLock(t, u)
	results := make([]response, duplicates)
	var wg sync.WaitGroup
	for i := range duplicates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = send(s.order("/orders", key, u, map[string]string{"X-Conformance-Hold": u}))
		}()
	}
	untilTrue(t, "one request holds the claim and waits at the gate", waitingForHold, u, 1)
	untilTrue(t, "19 duplicates wait in idem_claim",
		`SELECT count(*) = $1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%idem_claim%'`, duplicates-1)
	release()
	wg.Wait()
	replays := 0
	for i, r := range results {
		if r.err != nil || r.status != http.StatusCreated || !bytes.Equal(r.body, results[0].body) {
			t.Fatalf("request %d: %s (the first: %s)", i, r, results[0])
		}
		if r.header.Get("Idempotent-Replayed") == "true" {
			replays++
		}
	}
	if n := rowsOf(t, u); n != 1 || replays != duplicates-1 {
		t.Fatalf("%d concurrent duplicates: %d business rows, %d replayed", duplicates, n, replays)
	}
}

// The same without waiting: while the first is held, 19 duplicates get 409
// with Retry-After; after it, a retry is replayed; one business row.
func concurrentNoWait(t *testing.T, s *server) {
	u := runID()
	key := u + "-concurrent-nowait"
	release := holdLock(t, u)
	first := make(chan response, 1)
	go func() {
		first <- send(s.order("/conformance/orders-nowait", key, u, map[string]string{"X-Conformance-Hold": u}))
	}()
	untilTrue(t, "the first request holds the claim", waitingForHold, u, 1)
	results := make([]response, duplicates-1)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = send(s.order("/conformance/orders-nowait", key, u, nil))
		}()
	}
	wg.Wait()
	release()
	for i, r := range results {
		if r.err != nil || r.status != http.StatusConflict || r.header.Get("Retry-After") != "1" {
			t.Fatalf("duplicate %d while the first runs: %s", i, r)
		}
	}
	f := <-first
	again := send(s.order("/conformance/orders-nowait", key, u, nil))
	if f.status != http.StatusCreated || again.status != http.StatusCreated || !bytes.Equal(f.body, again.body) ||
		again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %s, retry %s", f, again)
	}
	if n := rowsOf(t, u); n != 1 {
		t.Fatalf("%d business rows", n)
	}
}

// The server SIGKILLed at a kill point (it announces it on the FIFO and
// blocks): before COMMIT nothing committed and the retry runs; after
// COMMIT (before the response) the row and the stored response committed
// and the retry is replayed that response.
func killed(t *testing.T, s *server, phase string) {
	u := runID()
	key := u + "-killed"
	line, killedResp := sendAndKill(t, s, s.order("/orders", key, u, map[string]string{"X-Test-Pause": phase}))
	if line != phase+"\n" || killedResp.err == nil {
		t.Fatalf("killed at %s (%q): the client got %s", phase, line, killedResp)
	}
	// The killed server's transaction ends when its backend sees the
	// connection gone (through PgBouncer, when PgBouncer closes it): wait
	// for the claim to leave in_progress.
	lookup := "SELECT state FROM idem_lookup($1, 'orders.create')"
	untilTrue(t, "the killed server's transaction has ended", "SELECT ("+lookup+") <> 'in_progress'", "4:acme:"+key)
	var state string
	if err := checkDB.QueryRow(context.Background(), lookup, "4:acme:"+key).Scan(&state); err != nil {
		t.Fatal(err)
	}
	rows := rowsOf(t, u)
	if phase == "before_commit" && (rows != 0 || state != "absent") {
		t.Fatalf("killed before COMMIT: %d rows, claim %s", rows, state)
	}
	if phase == "after_commit" && (rows != 1 || state != "completed") {
		t.Fatalf("killed after COMMIT: %d rows, claim %s", rows, state)
	}
	s.start()
	r := send(s.order("/orders", key, u, nil))
	wantReplayed := phase == "after_commit"
	var id int64
	checkDB.QueryRow(context.Background(), "SELECT id FROM conformance_rows WHERE run = $1", u).Scan(&id)
	if r.status != http.StatusCreated || (r.header.Get("Idempotent-Replayed") == "true") != wantReplayed ||
		r.header.Get("Location") != fmt.Sprintf("/conformance/rows/%d", id) {
		t.Fatalf("the retry after a kill at %s: %s (row %d)", phase, r, id)
	}
	if n := rowsOf(t, u); n != 1 {
		t.Fatalf("after the retry: %d business rows", n)
	}
}

// sendAndKill sends req, which stops at a kill point (the server
// announces it on the FIFO and blocks there), then SIGKILLs the server:
// the line the server wrote, and what the client got.
func sendAndKill(t *testing.T, s *server, req *http.Request) (string, response) {
	done := make(chan response, 1)
	go func() { done <- send(req) }()
	// (read-write: the open does not wait for the server's)
	fifo, err := os.OpenFile(s.fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(fifo).ReadString('\n')
		lines <- line
	}()
	var line string
	select {
	case line = <-lines:
	case r := <-done:
		fifo.Close()
		t.Fatalf("%s was answered before its kill point: %s; server log:\n%s", req.URL.Path, r, s.log)
	}
	fifo.Close()
	s.kill()
	return line, <-done
}

// Lease mode: the server killed after its external call and the call's
// checkpoint (the claim committed before the handler, the handler's own
// transaction not). Once idem_leases shows the lease ran out, the retry
// takes it over (attempt 2), resumes after the checkpoint without calling
// again, and commits the business row; the next retry is replayed.
func leaseTakeover(t *testing.T, s *server) {
	u := runID()
	key := u + "-lease-takeover"
	external := map[string]string{"X-Test-External": "1"}
	if line, r := sendAndKill(t, s, s.order("/charges", key, u,
		map[string]string{"X-Test-External": "1", "X-Test-Pause": "after_checkpoint"})); line != "after_checkpoint\n" || r.err == nil {
		t.Fatalf("killed after the checkpoint (%q): the client got %s", line, r)
	}
	lease := "SELECT %s FROM idem_leases WHERE biz_type = 'charges.create' AND key = $1"
	var point string
	if err := checkDB.QueryRow(context.Background(), fmt.Sprintf(lease, "recovery_point"), "4:acme:"+key).Scan(&point); err != nil || point != "called" {
		t.Fatalf("after the kill: the lease's recovery point %q (%v)", point, err)
	}
	if n := rowsOf(t, u); n != 1 {
		t.Fatalf("after the kill: %d rows (the external call's only)", n)
	}
	s.start()
	untilTrue(t, "the lease ran out", fmt.Sprintf(lease, "coalesce(bool_or(ran_out), false)"), "4:acme:"+key)
	r := send(s.order("/charges", key, u, external))
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" || r.header.Get("X-Attempt") != "2" {
		t.Fatalf("the retry after the lease ran out: %s", r)
	}
	again := send(s.order("/charges", key, u, external))
	if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, r.body) {
		t.Fatalf("the next retry: %s (the first answer: %s)", again, r)
	}
	var calls, writes int
	checkDB.QueryRow(context.Background(), "SELECT count(*) FILTER (WHERE tenant = 'external'), count(*) FILTER (WHERE tenant = 'acme') "+
		"FROM conformance_rows WHERE run = $1", u).Scan(&calls, &writes)
	if calls != 1 || writes != 1 {
		t.Fatalf("%d external calls, %d business rows (want one of each)", calls, writes)
	}
}

// Lease mode: a handler that answers 500 with a large body (64 kB, which
// net/http starts sending while the handler still writes) hands the lease
// back before any of the answer goes out. The test holds the claim's row
// (FOR UPDATE), so that idem_release waits for it; while pg_stat_activity
// shows that wait, the client must have received nothing. Then the
// client's immediate retry takes the lease over (attempt 2) and runs the
// handler: one business row.
func leaseLargeAnswer(t *testing.T, s *server) {
	u := runID()
	key := u + "-lease-500-large"
	ctx := context.Background()
	release := holdLock(t, u)
	req := s.order("/conformance/orders-lease", key, u,
		map[string]string{"X-Conformance-Hold": u, "X-Conformance-Status": "500", "X-Conformance-Pad": "65536"})
	headers := make(chan struct{})
	done := make(chan response, 1)
	go func() {
		resp, err := client.Do(req)
		close(headers) // the status line and headers arrived (or the request failed)
		if err != nil {
			done <- response{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		done <- response{status: resp.StatusCode, header: resp.Header, body: body, err: err}
	}()
	untilTrue(t, "the leased request waits at the gate (its claim committed)", waitingForHold, u, 1)
	rowLock, err := checkDB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rowLock.Rollback(ctx)
	var n int
	var pid int32
	if err := rowLock.QueryRow(ctx, `SELECT count(*), pg_backend_pid() FROM (SELECT FROM idem.claims
		WHERE biz_type = 'conformance.lease' AND key = $1 FOR UPDATE) c`, "4:acme:"+key).Scan(&n, &pid); err != nil || n != 1 {
		t.Fatalf("locking the claim's row: %d rows, %v", n, err)
	}
	release()
	untilTrue(t, "idem_release waits for the test's row lock",
		`SELECT count(*) = 1 FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)) AND query LIKE '%idem_release%'`, pid)
	select {
	case <-headers:
		t.Errorf("the 500 went out before its lease was handed back")
	default:
	}
	if err := rowLock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	first := <-done
	if first.err != nil || first.status != http.StatusInternalServerError || len(first.body) < 65536 ||
		first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the 500: %d %v %v (%d bytes)", first.status, first.header, first.err, len(first.body))
	}
	r := send(s.order("/conformance/orders-lease", key, u, nil))
	if r.err != nil || r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" || r.header.Get("X-Attempt") != "2" {
		t.Fatalf("the immediate retry after the 500: %s", r)
	}
	if n := rowsOf(t, u); n != 1 {
		t.Fatalf("after the retry: %d business rows (want 1)", n)
	}
}

// The handler's idem.Tx: its own savepoints work (one rolled back, one
// released), and its Commit is refused (the middleware ends the
// transaction after storing the response): 201, one business row, the
// retry replayed.
func handlerSavepoints(t *testing.T, s *server) {
	u := runID()
	key := u + "-savepoints"
	first := send(s.order("/conformance/orders", key, u, map[string]string{"X-Test-Savepoint": "1"}))
	again := send(s.order("/conformance/orders", key, u, map[string]string{"X-Test-Savepoint": "1"}))
	if first.err != nil || first.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" ||
		!bytes.Equal(first.body, again.body) {
		t.Fatalf("a handler with savepoints: %s, then %s; server log:\n%s", first, again, s.log)
	}
	if n := rowsOf(t, u); n != 1 {
		t.Fatalf("%d rows (want the released savepoint's only)", n)
	}
}
