package idem

import (
	"net/http"
	"testing"
)

// The per-request work of a new key that the middleware adds in this
// process (besides the round trips): the fingerprint of a small JSON body,
// and the stored document of a typical 201 JSON answer as it goes to
// idem_complete. `go test -run XXX -bench . -benchmem` in clients/go.

var benchBody = []byte(`{"order_id":"o-123","amount":1999,"currency":"EUR","items":[{"sku":"a","qty":2}],"note":"x"}`)

func BenchmarkRequestFingerprint(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		RequestFingerprint("POST", "/orders", "", "4:acme", benchBody, nil)
	}
}

func BenchmarkStoredDocument(b *testing.B) {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/orders/o-123")
	h.Set("X-Request-Id", "not stored")
	body := []byte(`{"order_id":"o-123","status":"accepted","amount":1999,"currency":"EUR"}` + "\n")
	keep := []string{"Content-Type", "Location"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := jsonText(toDocument(201, h, body, keep, 256<<10)); err != nil {
			b.Fatal(err)
		}
	}
}
