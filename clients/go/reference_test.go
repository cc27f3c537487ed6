package idem

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

// The one-pass canonicaliser against the implementation it replaces
// (oldfingerprint_test.go): the same bytes for the conformance table's
// inputs and for generated ones, valid JSON and not.

// sameCanonical fails t unless CanonicalBody and RequestFingerprint agree
// with the reference for body (and excludeFields).
func sameCanonical(t *testing.T, body []byte, excludeFields []string) {
	t.Helper()
	want := refCanonicalBody(body, excludeFields)
	got := CanonicalBody(body, excludeFields)
	if !bytes.Equal(got, want) || (got == nil) != (want == nil) {
		t.Fatalf("CanonicalBody(%q, %q)\n = %q\nthe reference %q", body, excludeFields, got, want)
	}
	const path, query, scope = "/orders/ü 1", "b=%7e&a=%2f", "4:acme"
	if got, want := RequestFingerprint("post", path, query, scope, body, excludeFields),
		refRequestFingerprint("post", path, query, scope, body, excludeFields); got != want {
		t.Fatalf("RequestFingerprint of %q, %q: %s, the reference %s", body, excludeFields, got, want)
	}
}

func TestCanonicalBodyConformanceAgainstReference(t *testing.T) {
	table := conformanceTable(t)
	for _, p := range append(table.Pairs, table.Bodies...) {
		sameCanonical(t, []byte(p[0]), nil)
		sameCanonical(t, []byte(p[1]), nil)
	}
}

// Inputs written out: numbers of every shape, the names UTF-16 orders
// apart from code points, escapes, not-JSON of each kind.
func TestCanonicalBodyCasesAgainstReference(t *testing.T) {
	cases := []string{
		"", " ", "\t\r\n ", "\u00a0", " \u00a0 1", "\ufeff{}", "\xff", `{"a":"\xff"}`, "{\"a\":\"\xed\xa0\x80\"}",
		"null", "true", "false", "nul", "truex", "[true,false,null]", `""`, `"x"`, "0", "-0", "-0.0", "-0e0", "00", "01",
		"1.", ".5", "1e", "1e+", "-", "--1", "+1", "1.0", "100", "0.1", "1e21", "1e20", "1E21", "1e-7", "1e-6", "0.000001",
		"0.0000001", "5e-324", "4.9e-324", "2e-324", "1e-400", "-1e-400", "1e400", "-1e400", "1.7976931348623157e308",
		"1.7976931348623159e308", "9007199254740992", "9007199254740993", "-9007199254740993", "999999999999999",
		"1000000000000000", "9999999999999999", "12345678901234567890", "123456789012345678901234",
		"1e+300", "1.5E-300", "123.456e10", "0e0", "0E-0", "1e0000000000000000000021", "1e-0000000000000000000007",
		"3.0e2", "0.30000000000000004", "1.0000000000000002", "100000000000000000000", "1000000000000000000000",
		`{}`, `[]`, `{ }`, `[ ]`, `{"a":1,}`, `[1,]`, `[,1]`, `{,}`, `{"a" 1}`, `{"a":}`, `{a:1}`, `{"a":1`, `[1`, `"abc`,
		`{"a":1} x`, `{"a":1} {"b":2}`, `{"a":1}}`, `{"a":1}]`, `{"a":1},`, `1 2`, `[] []`, `{"a":1}   `, "\n{\"a\":1}\n",
		`"\u0000\u001f\u007f\u0080\u2028\u2029\ud800\udc00\ud83d\ude00"`, `"\ud800"`, `"\udc00"`, `"\ud800\u0041"`,
		`"\ude00\ud83d"`, `"\ud83d\ude00\ud83d"`, `"\ud800\uZZZZ"`, `"\u12"`, `"\x"`, `"\'"`, `"\/\b\f\n\r\t\"\\"`,
		"\"a\tb\"", "\"\x7f\"", `"<>&"`,
		`{"b":1,"a":2,"b":3}`, `{"a":1,"a":{"x":1},"a":[2]}`, `{"\u0061":1,"a":2}`, `{"a":2,"\u0061":1}`,
		`{"\ue000":1,"\ud800\udc00":2,"\uffff":3,"\ud83d\ude00":4,"\uff61":5,"\ud7ff":6}`,
		"{\"\ue000\":1,\"\U00010000\":2,\"\uffff\":3,\"\U0001F600\":4,\"\uff61\":5,\"\ud7ff\":6,\"\u0080\":7}",
		`{"é":1,"z":2,"\u00e9\u0301":3,"😀":4,"ﬀ":5}`, `{"":1,"a":{"":2}}`, `{"a.b":1,"a":{"b":2,"c":3}}`,
		`{"sent_at": 5, "order": {"sku": "x", "nonce": 1}}`, `{"items":[{"sku":"a","nonce":1}],"sku":2}`,
	}
	excludes := [][]string{nil, {"a"}, {"a.b"}, {""}, {"a."}, {"a.b", "a"}, {"b", "\u00e9"}, {"order.nonce", "sent_at"},
		{"items.nonce"}, {"a.b.c"}, {".."}, {"\ue000", "\U0001F600"}, {"a", "a", "a.x"}}
	for _, in := range cases {
		for _, ex := range excludes {
			sameCanonical(t, []byte(in), ex)
		}
	}
	// encoding/json's nesting limit, 10000: at it, JSON; past it, not.
	// (With spaces, so that the canonical form is not the text itself.)
	for _, n := range []int{9999, 10000, 10001} {
		sameCanonical(t, []byte(strings.Repeat("[ ", n)+strings.Repeat("] ", n)), nil)
		sameCanonical(t, []byte(strings.Repeat(`{"a": `, n)+"1"+strings.Repeat("}", n)), nil)
		sameCanonical(t, []byte(strings.Repeat(`[{"a": `, n/2)+"[]"+strings.Repeat("}]", n/2)), nil)
	}
}

// jsonGen writes random JSON text: random whitespace, names from a set
// that UTF-16 orders apart from code points, repeated names, strings with
// each character at random as it is or escaped, numbers of every shape.
type jsonGen struct {
	r *rand.Rand
	b []byte
}

var genNames = []string{"", "a", "b", "aa", "ab", "a.b", "B", "order", "nonce", "é", "e\u0301", "\u00e9\u0301", "ﬀ",
	"\u0080", "\u07ff", "\u0800", "\ud7ff", "\ue000", "\ue001", "\uf8ff", "\ufb00", "\uff61", "\ufffd", "\uffff",
	"\U00010000", "\U0001F600", "\U0001F600a", "\U0010FFFF", "a\U00010000", "a\ue000", "a\uffff", "\"", "\\", "\n", "\x00"}

var genNumbers = []string{"0", "-0", "-0.0", "0.0", "1", "-1", "1.0", "100", "0.1", "1e21", "1e20", "1E21", "1e-7",
	"1e-6", "0.000001", "0.0000001", "5e-324", "2e-324", "1e-400", "1e400", "-1e400", "1.7976931348623157e308",
	"9007199254740992", "9007199254740993", "18446744073709551617", "123456789012345678901234", "999999999999999",
	"1000000000000000", "12345678901234.5", "1e+2", "1E-2", "0e5", "123e-20", "4.35", "0.30000000000000004"}

func (g *jsonGen) space() {
	for n := g.r.IntN(4) - 1; n > 0; n-- {
		g.b = append(g.b, " \t\n\r"[g.r.IntN(4)])
	}
}

func (g *jsonGen) char() rune {
	switch g.r.IntN(8) {
	case 0:
		return rune(g.r.IntN(0x20))
	case 1:
		return rune(0x80 + g.r.IntN(0x800-0x80))
	case 2:
		return rune(0x800 + g.r.IntN(0xd800-0x800))
	case 3:
		return rune(0xe000 + g.r.IntN(0x10000-0xe000))
	case 4:
		return rune(0x10000 + g.r.IntN(0x110000-0x10000))
	case 5:
		return []rune{'"', '\\', '/', '<', '>', '&', 0x7f, 0x2028, 0x2029, 0xfeff}[g.r.IntN(10)]
	}
	return rune(0x20 + g.r.IntN(0x5f))
}

func (g *jsonGen) str(s string) {
	g.b = append(g.b, '"')
	for _, c := range s {
		g.char1(c)
	}
	if g.r.IntN(20) == 0 { // a surrogate escape out of a pair: U+FFFD
		g.b = append(g.b, []string{`\ud800`, `\udfff`, `\udc00\ud800`, `\ud83dx`, `\ud83d\u0041`}[g.r.IntN(5)]...)
	}
	g.b = append(g.b, '"')
}

func (g *jsonGen) char1(c rune) {
	u4 := func(u rune) { // \uxxxx or \uXXXX
		h := strconv.FormatInt(int64(u)|0x10000, 16)[1:]
		if g.r.IntN(2) == 0 {
			h = strings.ToUpper(h)
		}
		g.b = append(append(g.b, '\\', 'u'), h...)
	}
	switch {
	case c == '"' || c == '\\' || c < 0x20:
		if short := map[rune]string{'"': `\"`, '\\': `\\`, '\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`}[c]; short != "" && g.r.IntN(2) == 0 {
			g.b = append(g.b, short...)
		} else {
			u4(c)
		}
	case c == '/' && g.r.IntN(2) == 0:
		g.b = append(g.b, `\/`...)
	case g.r.IntN(4) == 0:
		if c >= 0x10000 {
			hi, lo := utf16.EncodeRune(c)
			u4(hi)
			u4(lo)
		} else {
			u4(c)
		}
	default:
		g.b = utf8.AppendRune(g.b, c)
	}
}

func (g *jsonGen) name() string {
	if g.r.IntN(3) == 0 {
		var s []rune
		for n := g.r.IntN(4); n > 0; n-- {
			s = append(s, g.char())
		}
		return string(s)
	}
	return genNames[g.r.IntN(len(genNames))]
}

func (g *jsonGen) number() {
	switch g.r.IntN(4) {
	case 0:
		g.b = append(g.b, genNumbers[g.r.IntN(len(genNumbers))]...)
	case 1: // digits of any length, a fraction and an exponent or not
		if g.r.IntN(3) == 0 {
			g.b = append(g.b, '-')
		}
		g.b = append(g.b, byte('1'+g.r.IntN(9)))
		for n := g.r.IntN(25); n > 0; n-- {
			g.b = append(g.b, byte('0'+g.r.IntN(10)))
		}
		if g.r.IntN(2) == 0 {
			g.b = append(g.b, '.', byte('0'+g.r.IntN(10)))
			for n := g.r.IntN(20); n > 0; n-- {
				g.b = append(g.b, byte('0'+g.r.IntN(10)))
			}
		}
		if g.r.IntN(2) == 0 {
			g.b = append(g.b, "eE"[g.r.IntN(2)])
			g.b = append(g.b, []string{"", "+", "-"}[g.r.IntN(3)]...)
			g.b = strconv.AppendInt(g.b, int64(g.r.IntN(400)), 10)
		}
	default: // a double as Go writes it
		f := math.Float64frombits(g.r.Uint64())
		if g.r.IntN(2) == 0 {
			f = (g.r.Float64() - 0.5) * math.Pow(10, float64(g.r.IntN(60)-30))
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			f = 0.5
		}
		g.b = strconv.AppendFloat(g.b, f, "eEfg"[g.r.IntN(4)], []int{-1, -1, 3, 17}[g.r.IntN(4)], 64)
	}
}

func (g *jsonGen) value(depth int) {
	g.space()
	switch k := g.r.IntN(10); {
	case k < 2 && depth < 6:
		g.b = append(g.b, '{')
		var names []string
		for i, n := 0, g.r.IntN(6); i < n; i++ {
			if i > 0 {
				g.b = append(g.b, ',')
			}
			g.space()
			name := g.name()
			if len(names) > 0 && g.r.IntN(5) == 0 {
				name = names[g.r.IntN(len(names))] // a repeated name
			}
			names = append(names, name)
			g.str(name)
			g.space()
			g.b = append(g.b, ':')
			g.value(depth + 1)
		}
		g.space()
		g.b = append(g.b, '}')
	case k < 4 && depth < 6:
		g.b = append(g.b, '[')
		for i, n := 0, g.r.IntN(5); i < n; i++ {
			if i > 0 {
				g.b = append(g.b, ',')
			}
			g.value(depth + 1)
		}
		g.space()
		g.b = append(g.b, ']')
	case k < 6:
		var s []rune
		for n := g.r.IntN(8); n > 0; n-- {
			s = append(s, g.char())
		}
		g.str(string(s))
	case k < 9:
		g.number()
	default:
		g.b = append(g.b, []string{"true", "false", "null"}[g.r.IntN(3)]...)
	}
	g.space()
}

// spoil makes the text something else: cut, a byte put in or changed,
// trailing text, not UTF-8; often no longer JSON.
func (g *jsonGen) spoil() {
	if len(g.b) == 0 {
		return
	}
	at := g.r.IntN(len(g.b))
	switch g.r.IntN(6) {
	case 0:
		g.b = g.b[:at]
	case 1:
		c := `{}[],:"\ x0e.-+` + "\x00\x1f"
		g.b = append(g.b[:at], append([]byte{c[g.r.IntN(len(c))]}, g.b[at:]...)...)
	case 2:
		g.b[at] = `{}[],:"\ 0aeE.-`[g.r.IntN(15)]
	case 3:
		g.b = append(g.b, []string{"x", " 1", "{}", "]", ",", " ", "\n", "\u00a0", "null"}[g.r.IntN(9)]...)
	case 4:
		g.b[at] = []byte{0xff, 0xc0, 0x80, 0xed}[g.r.IntN(4)]
	default:
		g.b = append([]byte(" \n"[:g.r.IntN(3)]), g.b...)
	}
}

func (g *jsonGen) excludes() []string {
	var ex []string
	for n := g.r.IntN(4) - 1; n > 0; n-- {
		f := g.name()
		for g.r.IntN(2) == 0 {
			f += "." + g.name()
		}
		ex = append(ex, f)
	}
	return ex
}

func TestCanonicalBodyGeneratedAgainstReference(t *testing.T) {
	g := &jsonGen{r: rand.New(rand.NewPCG(8785, 1))}
	n := 6000
	if testing.Short() {
		n = 600
	}
	valid := 0
	for i := 0; i < n; i++ {
		g.b = g.b[:0]
		g.value(0)
		if g.r.IntN(3) == 0 {
			g.spoil()
		}
		if json.Valid(g.b) {
			valid++
		}
		sameCanonical(t, g.b, g.excludes())
	}
	// Both kinds were tried, not one.
	if valid < n/2 || valid > n*9/10 {
		t.Fatalf("%d of %d generated bodies valid JSON", valid, n)
	}
}

func TestUTF16CompareAgainstReference(t *testing.T) {
	g := &jsonGen{r: rand.New(rand.NewPCG(16, 2))}
	str := func() string {
		var b []byte
		for n := g.r.IntN(5); n > 0; n-- {
			switch g.r.IntN(6) {
			case 0: // not UTF-8, or cut short
				b = append(b, []byte{0xff, 0x80, 0xbf, 0xe2, 0xe2, 0x82, 0xf0, 0x9f, 0xed, 0xa0}[g.r.IntN(10)])
			case 1:
				b = append(b, genNames[g.r.IntN(len(genNames))]...)
			default:
				b = utf8.AppendRune(b, g.char())
			}
		}
		return string(b)
	}
	for i := 0; i < 40000; i++ {
		a, b := str(), str()
		if g.r.IntN(3) == 0 {
			b = a + b
		}
		got := utf16Compare(a, b)
		if less := refUTF16Less(a, b); (got < 0) != less || (got > 0) != refUTF16Less(b, a) {
			t.Fatalf("utf16Compare(%q, %q) = %d; the reference: a < b %v, b < a %v", a, b, got, less, refUTF16Less(b, a))
		}
		if bg := utf16Compare([]byte(a), []byte(b)); bg != got {
			t.Fatalf("utf16Compare(%q, %q): %d as strings, %d as bytes", a, b, got, bg)
		}
	}
}

func TestESNumberAgainstReference(t *testing.T) {
	r := rand.New(rand.NewPCG(262, 3))
	check := func(x float64) {
		if got, want := string(appendESNumber([]byte("x"), x)), "x"+refESNumber(x); got != want {
			t.Fatalf("appendESNumber(%v) = %s, the reference %s", x, got, want)
		}
	}
	for _, x := range []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 1e21, 1e20, 999999999999999900000, 1e-6, 1e-7,
		5e-324, math.MaxFloat64, math.SmallestNonzeroFloat64, 1 << 53, 1<<53 + 2, 123456789012345678901234,
		math.Inf(1), math.Inf(-1), math.NaN(), 0.30000000000000004, 1.5, 100, 1e300, 1e-300} {
		check(x)
	}
	for i := 0; i < 60000; i++ {
		check(math.Float64frombits(r.Uint64()))
		check(math.Round(r.NormFloat64()*1e6) * math.Pow(10, float64(r.IntN(50)-25)))
		check(float64(r.Int64N(1<<60)) * []float64{1, 1, 0.5, 0.01, 1e-10}[r.IntN(5)])
	}
}

func TestCanonicalJSONAgainstReference(t *testing.T) {
	g := &jsonGen{r: rand.New(rand.NewPCG(19, 4))}
	for i := 0; i < 5000; i++ {
		g.b = g.b[:0]
		g.value(0)
		dec := json.NewDecoder(bytes.NewReader(g.b))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) != nil {
			continue
		}
		if got, want := CanonicalJSON(v), refCanonicalJSON(v); got != want {
			t.Fatalf("CanonicalJSON of %s = %s, the reference %s", g.b, got, want)
		}
	}
	// What encoding/json does not decode to: float64, other types, strings
	// and names that are not UTF-8.
	v := map[string]any{"f": []any{0.1, math.Inf(1), -0.0, 1e21}, "i": 7, "t": true, "n": nil,
		"s": "a\xffb\xe2\x82", "\xff": 1, "\U0001F600": "\x00<\u2028>", "\uffff": []any{}}
	if got, want := CanonicalJSON(v), refCanonicalJSON(v); got != want {
		t.Fatalf("CanonicalJSON(%v) = %s, the reference %s", v, got, want)
	}
}

func TestCanonicalTargetAgainstReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3986, 5))
	const chars = "%%%aAfFgG09/?&=+ ~-._\xc3\xbc\x00\xff"
	s := func() string {
		b := make([]byte, r.IntN(12))
		for i := range b {
			b[i] = chars[r.IntN(len(chars))]
		}
		return string(b)
	}
	for i := 0; i < 20000; i++ {
		path, query := s(), s()
		if got, want := CanonicalTarget(path, query), refCanonicalTarget(path, query); got != want {
			t.Fatalf("CanonicalTarget(%q, %q) = %q, the reference %q", path, query, got, want)
		}
	}
}

// go test -run XXX -fuzz FuzzCanonicalBodyAgainstReference: any body, and
// a field to exclude, against the reference (without -fuzz, the seeds).
func FuzzCanonicalBodyAgainstReference(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[1.0,-0,1e21]}`, `{"\ue000":1,"😀":2,"a":{"b":3}}`, `"\ud800x"`, "1 2", "\xff", " "} {
		f.Add([]byte(s), "a.b")
	}
	f.Fuzz(func(t *testing.T, body []byte, exclude string) {
		sameCanonical(t, body, []string{exclude})
		sameCanonical(t, body, nil)
	})
}
