package main_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The conformance table (tests/middleware/README.md has its format).
type conformance struct {
	Format      int               `json:"format"`
	ProblemBase string            `json:"problem_base"`
	Problems    map[string][2]any `json:"problems"`
	Defaults    map[string]string `json:"defaults"`
	Cases       []conformanceCase `json:"cases"`
}

type conformanceCase struct {
	Name  string `json:"name"`
	Rule  string `json:"rule"`
	Route string `json:"route"`
	Seed  *struct {
		Claim   string          `json:"claim"`
		BizType string          `json:"biz_type"`
		State   string          `json:"state"`
		Result  json.RawMessage `json:"result"`
	} `json:"seed"`
	Configure *struct {
		BizType   string `json:"biz_type"`
		OnFailure string `json:"on_failure"`
	} `json:"configure"`
	Requests []conformanceReq `json:"requests"`
	Rows     int              `json:"rows"`
}

type conformanceReq struct {
	Key          []string        `json:"key"`
	Tenant       json.RawMessage `json:"tenant"` // absent: the default; null: none
	Body         *string         `json:"body"`
	ContentType  string          `json:"content_type"`
	Route        string          `json:"route"`
	Query        string          `json:"query"`
	Status       int             `json:"status"`
	Fail         string          `json:"fail"`
	Pad          int             `json:"pad"`
	Hold         bool            `json:"hold"`
	AfterRelease bool            `json:"after_release"`
	Expect       struct {
		Status   int                `json:"status"`
		Replayed *bool              `json:"replayed"`
		Ran      bool               `json:"ran"`
		SameAs   *int               `json:"same_as"`
		Headers  map[string]*string `json:"headers"`
		Problem  string             `json:"problem"`
		Expires  *bool              `json:"expires"`
	} `json:"expect"`
}

var table conformance

func loadTable(t *testing.T) {
	if table.Format != 0 {
		return
	}
	path := os.Getenv("IDEM_TEST_CONFORMANCE")
	if path == "" {
		path = "../../../tests/middleware/conformance.json"
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the conformance table: %v", err)
	}
	if err := json.Unmarshal(raw, &table); err != nil || table.Format != 1 {
		t.Fatalf("the conformance table %s: format %d, %v", path, table.Format, err)
	}
}

var repeatX = regexp.MustCompile(`\{x\*(\d+)\}`)

func fill(s, u string) string {
	s = strings.ReplaceAll(s, "{u}", u)
	return repeatX.ReplaceAllStringFunc(s, func(m string) string {
		n, _ := strconv.Atoi(repeatX.FindStringSubmatch(m)[1])
		return strings.Repeat("x", n)
	})
}

func runID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

type response struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (r response) String() string {
	if r.err != nil {
		return r.err.Error()
	}
	return fmt.Sprintf("%d %v %s", r.status, r.header, r.body)
}

func send(req *http.Request) response {
	resp, err := client.Do(req)
	if err != nil {
		return response{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: body, err: err}
}

func (s *server) request(c conformanceCase, rq conformanceReq, u string, hold bool) *http.Request {
	route := rq.Route
	if route == "" {
		route = c.Route
	}
	if route == "" {
		route = table.Defaults["route"]
	}
	target := s.base + route
	if rq.Query != "" {
		target += "?" + rq.Query
	}
	body := table.Defaults["body"]
	if rq.Body != nil {
		body = *rq.Body
	}
	req, _ := http.NewRequest(http.MethodPost, target, strings.NewReader(fill(body, u)))
	contentType := "application/json"
	if rq.ContentType != "" {
		contentType = rq.ContentType
	}
	req.Header.Set("Content-Type", contentType)
	for _, line := range rq.Key {
		req.Header.Add("Idempotency-Key", fill(line, u))
	}
	switch {
	case rq.Tenant == nil:
		req.Header.Set("X-Tenant", table.Defaults["tenant"])
	case string(rq.Tenant) != "null":
		var tenant string
		json.Unmarshal(rq.Tenant, &tenant)
		req.Header.Set("X-Tenant", fill(tenant, u))
	}
	if rq.Status != 0 {
		req.Header.Set("X-Conformance-Status", strconv.Itoa(rq.Status))
	}
	if rq.Fail != "" {
		req.Header.Set("X-Conformance-Fail", rq.Fail)
	}
	if rq.Pad != 0 {
		req.Header.Set("X-Conformance-Pad", strconv.Itoa(rq.Pad))
	}
	if hold {
		req.Header.Set("X-Conformance-Hold", u)
	}
	return req
}

// untilTrue polls the test's connection until sql (with args) returns true;
// a bound of 2 minutes fails the test: it waits for a state, it never
// judges by time.
func untilTrue(t *testing.T, what, sql string, args ...any) {
	t.Helper()
	for i := 0; i < 4800; i++ {
		var ok bool
		if err := checkDB.QueryRow(context.Background(), sql, args...).Scan(&ok); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("still not true after 2 minutes: %s", what)
}

// A backend waits for the advisory lock of hashtext(u).
const waitingForHold = `SELECT count(*) >= $2 FROM pg_locks
  WHERE locktype = 'advisory' AND NOT granted AND objid::text::bigint = hashtext($1)::bigint & 4294967295`

func rowsOf(t *testing.T, run string) int {
	var n int
	if err := checkDB.QueryRow(context.Background(), "SELECT count(*) FROM conformance_rows WHERE run = $1", run).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// seedClaim: a claim finished by other code (a SQL handler, a consumer),
// before the case's requests.
func seedClaim(t *testing.T, claim, bizType, state string, result json.RawMessage, u string) {
	t.Helper()
	ctx := context.Background()
	claim = fill(claim, u)
	var doc any // SQL NULL for a JSON null
	if len(result) > 0 && string(result) != "null" {
		doc = string(result)
	}
	finish := "idem_fail"
	if state == "completed" {
		finish = "idem_complete"
	}
	tx, err := checkDB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT idem_claim($1, $2)", claim, bizType); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT "+finish+"($1, $2, $3::jsonb)", claim, bizType, doc); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func runConformance(t *testing.T, s *server) {
	for _, c := range table.Cases {
		t.Run(c.Name, func(t *testing.T) {
			u := runID()
			got := make([]response, len(c.Requests))
			var ids []int64
			check := func(i int) {
				t.Helper()
				checkExpect(t, c.Requests[i], got[i], got, &ids, i)
			}
			holdConn, err := checkDB.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer holdConn.Release()
			if c.Configure != nil {
				// The business type's failure policy (its TTL the
				// default), before the requests.
				if _, err := checkDB.Exec(context.Background(), "SELECT idem_configure($1, NULL, $2)",
					c.Configure.BizType, c.Configure.OnFailure); err != nil {
					t.Fatal(err)
				}
			}
			if c.Seed != nil {
				seedClaim(t, c.Seed.Claim, c.Seed.BizType, c.Seed.State, c.Seed.Result, u)
			}
			held := -1
			var heldDone chan response
			for i, rq := range c.Requests {
				if rq.AfterRelease {
					continue
				}
				if rq.Hold {
					if _, err := holdConn.Exec(context.Background(), "SELECT pg_advisory_lock(hashtext($1))", u); err != nil {
						t.Fatal(err)
					}
					held, heldDone = i, make(chan response, 1)
					req := s.request(c, rq, u, true)
					go func() { heldDone <- send(req) }()
					untilTrue(t, "the held request waits for the runner's lock", waitingForHold, u, 1)
					continue
				}
				got[i] = send(s.request(c, rq, u, false))
				check(i)
			}
			if held >= 0 {
				if _, err := holdConn.Exec(context.Background(), "SELECT pg_advisory_unlock(hashtext($1))", u); err != nil {
					t.Fatal(err)
				}
				got[held] = <-heldDone
				check(held)
			}
			for i, rq := range c.Requests {
				if rq.AfterRelease {
					got[i] = send(s.request(c, rq, u, false))
					check(i)
				}
			}
			if n := rowsOf(t, u); n != c.Rows {
				t.Errorf("%d business rows committed, the table says %d", n, c.Rows)
			}
		})
	}
}

func checkExpect(t *testing.T, rq conformanceReq, r response, all []response, ids *[]int64, i int) {
	t.Helper()
	e := rq.Expect
	if r.err != nil {
		t.Fatalf("request %d: %v", i, r.err)
	}
	replayed := r.header.Get("Idempotent-Replayed") == "true"
	if e.Problem != "" {
		p := table.Problems[e.Problem]
		status, title := int(p[0].(float64)), p[1].(string)
		var doc struct {
			Type, Title, Detail string
			Status              int
		}
		err := json.Unmarshal(r.body, &doc)
		if r.status != status || r.header.Get("Content-Type") != "application/problem+json" || err != nil ||
			doc.Type != table.ProblemBase+e.Problem || doc.Title != title || doc.Status != status || doc.Detail == "" || replayed {
			t.Errorf("request %d: want problem %s (%d %q), got %s", i, e.Problem, status, title, r)
		}
	}
	if e.Status != 0 && r.status != e.Status {
		t.Errorf("request %d: status %d, want %d: %s", i, r.status, e.Status, r)
	}
	if e.Replayed != nil && replayed != *e.Replayed {
		t.Errorf("request %d: replayed %v, want %v: %s", i, replayed, *e.Replayed, r)
	}
	var body struct {
		ID int64 `json:"id"`
	}
	hasID := json.Unmarshal(r.body, &body) == nil && body.ID != 0
	if e.Ran {
		if !hasID {
			t.Errorf("request %d: the handler should have run, body %s", i, r.body)
		}
		for _, id := range *ids {
			if id == body.ID {
				t.Errorf("request %d: id %d was seen before: the handler did not run", i, id)
			}
		}
	}
	if hasID {
		*ids = append(*ids, body.ID)
	}
	if e.Expires != nil {
		// Idempotent-Expires: absent, or an IMF-fixdate in the future.
		v, present := r.header["Idempotent-Expires"]
		switch {
		case !*e.Expires && present:
			t.Errorf("request %d: Idempotent-Expires %v, expected none", i, v)
		case *e.Expires && !present:
			t.Errorf("request %d: no Idempotent-Expires", i)
		case *e.Expires:
			when, err := time.Parse(http.TimeFormat, v[0])
			if err != nil || !when.After(time.Now()) {
				t.Errorf("request %d: Idempotent-Expires %q is not an HTTP-date in the future (%v)", i, v[0], err)
			}
		}
	}
	if e.SameAs != nil {
		first := all[*e.SameAs]
		if !bytes.Equal(first.body, r.body) || first.header.Get("Content-Type") != r.header.Get("Content-Type") ||
			first.header.Get("Location") != r.header.Get("Location") {
			t.Errorf("request %d: not the same as request %d: %s vs %s", i, *e.SameAs, r, first)
		}
	}
	for name, want := range e.Headers {
		vs, present := r.header[http.CanonicalHeaderKey(name)]
		switch {
		case want == nil && present:
			t.Errorf("request %d: header %s should be absent, is %v", i, name, vs)
		case want != nil && (!present || vs[0] != *want):
			t.Errorf("request %d: header %s = %v, want %q", i, name, vs, *want)
		}
	}
}
