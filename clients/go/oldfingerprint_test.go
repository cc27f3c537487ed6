package idem

// The fingerprint as it was computed before the one-pass canonicaliser
// (fingerprint.go): encoding/json's decoder into map[string]any, then
// RFC 8785 written from that tree. Kept as the reference the canonicaliser
// is held to (reference_test.go).

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// RequestFingerprint is the fingerprint every idem client computes (docs/
// http.md, "The rules"): 128 bits of SHA-256 (32 hex digits) over
// "METHOD target\nscope\n" and the canonical body, where target is
// refCanonicalTarget(path, rawQuery). Never the headers: tokens rotate and
// trace ids change between retries.
func refRequestFingerprint(method, path, rawQuery, scope string, body []byte, excludeFields []string) string {
	h := sha256.New()
	h.Write([]byte(strings.ToUpper(method) + " " + refCanonicalTarget(path, rawQuery) + "\n" + scope + "\n"))
	h.Write(refCanonicalBody(body, excludeFields))
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// CanonicalTarget is the request target as every idem client counts it
// (docs/http.md, "The fingerprint"): the decoded path (r.URL.Path) with
// every byte but the unreserved characters and "/" percent-encoded in
// upper-case hex; the query as sent (r.URL.RawQuery), its escapes
// normalised (upper-case hex, unreserved characters decoded: RFC 3986,
// 6.2.2); "?" only before a query.
func refCanonicalTarget(path, rawQuery string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(path); i++ {
		if c := path[i]; unreserved(c) || c == '/' {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	if rawQuery == "" {
		return b.String()
	}
	b.WriteByte('?')
	for i := 0; i < len(rawQuery); i++ {
		if rawQuery[i] == '%' && i+2 < len(rawQuery) && isHex(rawQuery[i+1]) && isHex(rawQuery[i+2]) {
			v, _ := strconv.ParseUint(rawQuery[i+1:i+3], 16, 8)
			if unreserved(byte(v)) {
				b.WriteByte(byte(v))
			} else {
				b.WriteString("%" + strings.ToUpper(rawQuery[i+1:i+3]))
			}
			i += 2
			continue
		}
		b.WriteByte(rawQuery[i])
	}
	return b.String()
}

// CanonicalBody is the body's canonical form: RFC 8785 JSON if the body
// is JSON (less the excluded fields: top-level names or dotted paths),
// else the bytes as they are; an empty (or blank) body is empty.
func refCanonicalBody(body []byte, excludeFields []string) []byte {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if !utf8.Valid(body) {
		return body
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return body
	}
	if _, err := dec.Token(); err == nil || !refIsEOF(err) {
		return body // more than one value: not JSON
	}
	for _, f := range excludeFields {
		refDrop(v, strings.Split(f, "."))
	}
	var b strings.Builder
	refCanonicalJSONTo(&b, v)
	return []byte(b.String())
}

func refIsEOF(err error) bool { return errors.Is(err, io.EOF) }

func refDrop(v any, path []string) {
	m, ok := v.(map[string]any)
	if !ok || len(path) == 0 {
		return
	}
	if len(path) == 1 {
		delete(m, path[0])
		return
	}
	refDrop(m[path[0]], path[1:])
}

// CanonicalJSON writes v (as encoding/json decodes with UseNumber) in RFC
// 8785 (JCS) form: members sorted by their names' UTF-16 code units, no
// insignificant whitespace, numbers as IEEE 754 doubles written as
// ECMAScript writes them, strings as JSON.stringify escapes them.
func refCanonicalJSON(v any) string {
	var b strings.Builder
	refCanonicalJSONTo(&b, v)
	return b.String()
}

func refCanonicalJSONTo(b *strings.Builder, v any) {
	switch x := v.(type) {
	case map[string]any:
		names := make([]string, 0, len(x))
		for k := range x {
			names = append(names, k)
		}
		sort.Slice(names, func(i, j int) bool { return refUTF16Less(names[i], names[j]) })
		b.WriteByte('{')
		for i, k := range names {
			if i > 0 {
				b.WriteByte(',')
			}
			refWriteString(b, k)
			b.WriteByte(':')
			refCanonicalJSONTo(b, x[k])
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			refCanonicalJSONTo(b, e)
		}
		b.WriteByte(']')
	case string:
		refWriteString(b, x)
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil && !math.IsInf(f, 0) {
			b.WriteString("null")
			return
		}
		b.WriteString(refESNumber(f))
	case float64:
		b.WriteString(refESNumber(x))
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	default:
		b.WriteString("null")
	}
}

func refUTF16Less(a, b string) bool {
	ua, ub := utf16.Encode([]rune(a)), utf16.Encode([]rune(b))
	for i := 0; i < len(ua) && i < len(ub); i++ {
		if ua[i] != ub[i] {
			return ua[i] < ub[i]
		}
	}
	return len(ua) < len(ub)
}

// writeString escapes as JSON.stringify: \" \\ \b \f \n \r \t, other
// control characters as \u00xx, everything else as it is.
func refWriteString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte("0123456789abcdef"[r>>4])
				b.WriteByte("0123456789abcdef"[r&0xf])
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// esNumber writes a double as ECMAScript's Number::toString (RFC 8785
// 3.2.2.3): the shortest digits that round-trip, plain from 1e-6 to 1e21.
// Infinite values (a number beyond the double range) are written null, as
// JSON.stringify does.
func refESNumber(x float64) string {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return "null"
	}
	if x == 0 {
		return "0"
	}
	if x < 0 {
		return "-" + refESNumber(-x)
	}
	// d.ddddde±n: the shortest round-trip digits and the exponent
	e := strconv.FormatFloat(x, 'e', -1, 64)
	mant, exps, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(exps)
	digits := strings.Replace(mant, ".", "", 1)
	k := len(digits)
	n := exp + 1 // the decimal point's position after the first n digits
	switch {
	case k <= n && n <= 21:
		return digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		return digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		return "0." + strings.Repeat("0", -n) + digits
	}
	m := digits[:1]
	if k > 1 {
		m += "." + digits[1:]
	}
	sign := "+"
	if n-1 < 0 {
		sign = "-"
	}
	return m + "e" + sign + strconv.Itoa(refAbs(n-1))
}

func refAbs(i int) int {
	if i < 0 {
		return -i
	}
	return i
}
