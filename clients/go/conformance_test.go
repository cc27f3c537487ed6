package idem

import (
	"encoding/json"
	"os"
	"testing"
)

// The conformance table's canonical JSON pairs (tests/middleware/
// conformance.json, shared by every idem client): CanonicalBody gives each
// input's canonical form exactly.
func TestConformanceCanonicalJSON(t *testing.T) {
	raw, err := os.ReadFile("../../tests/middleware/conformance.json")
	if err != nil {
		t.Fatalf("the conformance table: %v", err)
	}
	var table struct {
		Pairs    [][2]string       `json:"canonical_json"`
		Problems map[string][2]any `json:"problems"`
	}
	if err := json.Unmarshal(raw, &table); err != nil || len(table.Pairs) == 0 {
		t.Fatalf("the conformance table: %d pairs, %v", len(table.Pairs), err)
	}
	for _, p := range table.Pairs {
		if got := string(CanonicalBody([]byte(p[0]), nil)); got != p[1] {
			t.Errorf("CanonicalBody(%s) = %s, the table says %s", p[0], got, p[1])
		}
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
