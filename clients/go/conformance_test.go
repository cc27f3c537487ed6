package idem

import (
	"encoding/json"
	"net/url"
	"os"
	"testing"
)

// conformanceTable reads tests/middleware/conformance.json, the table every
// idem client is held to.
func conformanceTable(t *testing.T) (table struct {
	Pairs    [][2]string       `json:"canonical_json"`
	Bodies   [][2]string       `json:"canonical_body"`
	Targets  [][2]string       `json:"canonical_target"`
	Problems map[string][2]any `json:"problems"`
}) {
	t.Helper()
	raw, err := os.ReadFile("../../tests/middleware/conformance.json")
	if err != nil {
		t.Fatalf("the conformance table: %v", err)
	}
	if err := json.Unmarshal(raw, &table); err != nil || len(table.Pairs) == 0 || len(table.Bodies) == 0 {
		t.Fatalf("the conformance table: %d and %d pairs, %v", len(table.Pairs), len(table.Bodies), err)
	}
	return table
}

// The conformance table's canonical JSON pairs: CanonicalBody gives each
// input's canonical form exactly.
func TestConformanceCanonicalJSON(t *testing.T) {
	table := conformanceTable(t)
	for _, p := range table.Pairs {
		if got := string(CanonicalBody([]byte(p[0]), nil)); got != p[1] {
			t.Errorf("CanonicalBody(%s) = %s, the table says %s", p[0], got, p[1])
		}
	}
	for _, p := range table.Bodies {
		if got := string(CanonicalBody([]byte(p[0]), nil)); got != p[1] {
			t.Errorf("CanonicalBody(%q) = %q, the table says %q", p[0], got, p[1])
		}
	}
	// The target as net/http gives it: the path decoded, the query as sent.
	for _, p := range table.Targets {
		u, err := url.ParseRequestURI(p[0])
		if err != nil {
			t.Fatalf("%s: %v", p[0], err)
		}
		if got := CanonicalTarget(u.Path, u.RawQuery); got != p[1] {
			t.Errorf("CanonicalTarget(%s) = %s, the table says %s", p[0], got, p[1])
		}
	}
	if len(table.Bodies) < 5 || len(table.Targets) < 5 {
		t.Errorf("%d body and %d target pairs", len(table.Bodies), len(table.Targets))
	}
	// One set of problem types in every client (docs/http.md, "Problem types").
	if len(table.Problems) != len(Problems) {
		t.Errorf("%d problem types, the table has %d", len(Problems), len(table.Problems))
	}
	for slug, p := range table.Problems {
		if got, ok := Problems[slug]; !ok || float64(got.Status) != p[0] || got.Title != p[1] {
			t.Errorf("problem %s: %+v, the table says %v", slug, got, p)
		}
	}
}
