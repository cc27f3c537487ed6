package idem

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"
	"unicode/utf8"
)

// The stored document, written by hand, against encoding/json's marshal of
// the struct it replaces: the same bytes (so the same value) for random
// statuses, headers (not all of them UTF-8) and bodies (text, binary,
// over MaxStoredBody).
func TestStoredDocumentAgainstReference(t *testing.T) {
	g := &jsonGen{r: rand.New(rand.NewPCG(201, 6))}
	text := func(n int) []byte {
		var b []byte
		for ; n > 0; n-- {
			switch g.r.IntN(8) {
			case 0:
				b = append(b, byte(g.r.IntN(256))) // binary, most likely
			case 1:
				s := "<>&\"\\/\u2028\u2029\x7f\x00"
				b = append(b, s[g.r.IntN(len(s))])
			default:
				b = utf8.AppendRune(b, g.char())
			}
		}
		return b
	}
	keeps := [][]string{nil, {"Content-Type", "Location"}, {"content-type", "x-custom", "Location"}, {"ETag", "etag"}}
	for i := 0; i < 4000; i++ {
		h := http.Header{}
		for n := g.r.IntN(4); n > 0; n-- {
			h.Add([]string{"Content-Type", "Location", "X-Custom", "Etag", "X-Other"}[g.r.IntN(5)], string(text(g.r.IntN(12))))
		}
		var body []byte
		switch g.r.IntN(4) {
		case 0:
			body = nil
		case 1:
			body = []byte(`{"order_id":"o-` + strconv.Itoa(i) + `","note":"<a&b>"}`)
		default:
			body = text(g.r.IntN(80))
		}
		status, keep, max := 100+g.r.IntN(500), keeps[g.r.IntN(len(keeps))], g.r.IntN(100)
		want, err := json.Marshal(refToDocument(status, h, body, keep, max))
		if err != nil {
			t.Fatal(err)
		}
		got := toDocument(status, h, body, keep, max)
		if !bytes.Equal(got, want) {
			t.Fatalf("toDocument(%d, %q, %q, %q, %d)\n = %s\nthe reference %s", status, h, body, keep, max, got, want)
		}
		if r, ok := fromDocument(got); !ok || r.status != status || len(body) <= max && !bytes.Equal(r.body, body) {
			t.Fatalf("%s read back: %+v", got, r)
		}
	}
}
