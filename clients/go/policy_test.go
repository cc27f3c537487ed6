package idem

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestParseKeyField(t *testing.T) {
	const k = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	cases := []struct {
		raw, key string
		bare     bool
	}{
		{`"` + k + `"`, k, false},
		{" \t\"" + k + "\" ", k, false},
		{`"abc\"def\\ghijklmnop"`, `abc"def\ghijklmnop`, false},
		{k, "", false},                          // bare: refused by default
		{k, k, true},                            // accepted with BareKeys
		{`"` + k + `", "` + k + `"`, "", false}, // two field lines
		{`"` + k + `";a=1`, "", false},          // parameters
		{`"` + k, "", false},                    // not terminated
		{`"short"`, "", false},                  // under 16
		{`"` + strings.Repeat("x", 256) + `"`, "", false},
		{`"with space in the middle"`, "", false},
		{`"bad\escape-0123456789"`, "", false},
		{"\"caf\xc3\xa9-0123456789abcdef\"", "", false},
		{"", "", false},
	}
	for _, c := range cases {
		got, why := ParseKeyField(c.raw, 16, 255, c.bare)
		if got != c.key {
			t.Errorf("ParseKeyField(%q, bare=%v) = %q (%s), want %q", c.raw, c.bare, got, why, c.key)
		}
		if got == "" && why == "" {
			t.Errorf("ParseKeyField(%q): refused without a reason", c.raw)
		}
	}
}

func TestScopeIsInjective(t *testing.T) {
	// Under "tenant:key" these two would be one claim.
	a := ScopedKey(TenantScope("acme"), "x:0123456789abcdef")
	b := ScopedKey(TenantScope("acme:x"), "0123456789abcdef")
	if a == b {
		t.Fatalf("tenants acme and acme:x share the key %q", a)
	}
	if ScopedKey(SharedScope, "k") != "-:k" || TenantScope("ü") != "2:ü" {
		t.Fatalf("scopes: %q %q", ScopedKey(SharedScope, "k"), TenantScope("ü"))
	}
}

func TestDefaultStore(t *testing.T) {
	for status, want := range map[int]bool{200: true, 201: true, 204: true, 303: true, 400: true, 404: true, 409: true,
		422: true, 401: false, 403: false, 407: false, 408: false, 425: false, 429: false, 500: false, 503: false, 101: false} {
		if DefaultStore(status) != want {
			t.Errorf("DefaultStore(%d) = %v", status, !want)
		}
	}
}

func TestCanonicalBody(t *testing.T) {
	cases := map[string]string{
		`{ "b": 1, "a": [1.0, 1e0, 10, 1e21, 1e-7, 0.000001, -0, 123456789012345678901234] }`: `{"a":[1,1,10,1e+21,1e-7,0.000001,0,1.2345678901234569e+23],"b":1}`,
		`{"é":1,"z":2,"\u00e9\u0301":3,"😀":4,"ﬀ":5}`:                                          `{"z":2,"é":1,"é́":3,"😀":4,"ﬀ":5}`,
		`"a\u0001\n\"<>&\u2028"`: "\"a\\u0001\\n\\\"<>&\u2028\"",
		"  ":                     "",
		"not json":               "not json",
		`{"a":1} {"b":2}`:        `{"a":1} {"b":2}`,
		`{"a": 1e400}`:           `{"a":null}`,
	}
	for in, want := range cases {
		if got := string(CanonicalBody([]byte(in), nil)); got != want {
			t.Errorf("CanonicalBody(%s) = %s, want %s", in, got, want)
		}
	}
	got := string(CanonicalBody([]byte(`{"sent_at": 5, "order": {"sku": "x", "nonce": 1}}`), []string{"sent_at", "order.nonce"}))
	if got != `{"order":{"sku":"x"}}` {
		t.Errorf("excluded fields: %s", got)
	}
}

func TestRequestFingerprint(t *testing.T) {
	a := RequestFingerprint("post", "/orders", "", "4:acme", []byte(`{"qty": 2, "sku": "s"}`), nil)
	b := RequestFingerprint("POST", "/orders", "", "4:acme", []byte(`{"sku":"s","qty":2.0}`), nil)
	if a != b || len(a) != 32 {
		t.Fatalf("the same request, re-serialised: %s vs %s", a, b)
	}
	for _, other := range []string{
		RequestFingerprint("POST", "/orders", "x=1", "4:acme", []byte(`{"qty": 2, "sku": "s"}`), nil),
		RequestFingerprint("POST", "/orders", "", "5:other", []byte(`{"qty": 2, "sku": "s"}`), nil),
		RequestFingerprint("POST", "/orders", "", "4:acme", []byte(`{"qty": 3, "sku": "s"}`), nil),
		RequestFingerprint("PUT", "/orders", "", "4:acme", []byte(`{"qty": 2, "sku": "s"}`), nil),
	} {
		if other == a {
			t.Fatalf("a different request has the same fingerprint %s", a)
		}
	}
}

func TestStoredDocumentRoundTrip(t *testing.T) {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/orders/7")
	h.Set("X-Request-Id", "not stored")
	for _, body := range [][]byte{[]byte(`{"id":7}`), {0xff, 0x00, 0x01}, nil} {
		doc := toDocument(201, h, body, []string{"content-type", "Location"}, 1024)
		raw, _ := json.Marshal(doc)
		r, ok := fromDocument(raw)
		if !ok || r.status != 201 || string(r.body) != string(body) || r.header.Get("Location") != "/orders/7" ||
			r.header.Get("X-Request-Id") != "" {
			t.Fatalf("round trip of %q through %s: %+v", body, raw, r)
		}
	}
	// The Node client's document and docs/http.md's SQL handler's.
	for raw, want := range map[string]string{
		`{"status":201,"headers":{"content-type":"application/json"},"body":"eyJhIjoxfQ==","encoding":"base64"}`: `{"a":1}`,
		`{"status":201,"headers":{"Location":"/orders/1"},"body":{"order_id":1}}`:                                `{"order_id":1}`,
	} {
		r, ok := fromDocument(json.RawMessage(raw))
		if !ok || string(r.body) != want {
			t.Fatalf("%s: %+v", raw, r)
		}
	}
	// No response (no integer status): a claim finished by other code.
	for _, raw := range []string{"", "null", `{"order_id":7}`, `{"status":"201"}`, `{"status":true}`, `{"status":1000}`, `[1]`} {
		if _, ok := fromDocument(json.RawMessage(raw)); ok {
			t.Fatalf("%q is not a stored response", raw)
		}
	}
}
