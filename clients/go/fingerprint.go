package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// RequestFingerprint is the fingerprint every idem client computes (docs/
// http.md, "The rules"): 128 bits of SHA-256 (32 hex digits) over
// "METHOD target\nscope\n" and the canonical body, where target is
// CanonicalTarget(path, rawQuery). Never the headers: tokens rotate and
// trace ids change between retries.
func RequestFingerprint(method, path, rawQuery, scope string, body []byte, excludeFields []string) string {
	c := newCanonicaliser()
	defer c.release()
	c.out = append(c.out, strings.ToUpper(method)...)
	c.out = append(c.out, ' ')
	c.out = appendCanonicalTarget(c.out, path, rawQuery)
	c.out = append(c.out, '\n')
	c.out = append(c.out, scope...)
	c.out = append(c.out, '\n')
	var sum [sha256.Size]byte
	if c.body(body, excludeFields) {
		sum = sha256.Sum256(c.out)
	} else {
		// The body as it is: hashed where it lies rather than copied.
		h := sha256.New()
		h.Write(c.out)
		h.Write(body)
		h.Sum(sum[:0])
	}
	return hex.EncodeToString(sum[:16])
}

// CanonicalTarget is the request target as every idem client counts it
// (docs/http.md, "The fingerprint"): the decoded path (r.URL.Path) with
// every byte but the unreserved characters and "/" percent-encoded in
// upper-case hex; the query as sent (r.URL.RawQuery), its escapes
// normalised (upper-case hex, unreserved characters decoded: RFC 3986,
// 6.2.2); "?" only before a query.
func CanonicalTarget(path, rawQuery string) string {
	return string(appendCanonicalTarget(nil, path, rawQuery))
}

func appendCanonicalTarget(b []byte, path, rawQuery string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(path); i++ {
		if c := path[i]; unreserved(c) || c == '/' {
			b = append(b, c)
		} else {
			b = append(b, '%', hex[c>>4], hex[c&15])
		}
	}
	if rawQuery == "" {
		return b
	}
	b = append(b, '?')
	for i := 0; i < len(rawQuery); i++ {
		if rawQuery[i] == '%' && i+2 < len(rawQuery) && isHex(rawQuery[i+1]) && isHex(rawQuery[i+2]) {
			if v := unhex(rawQuery[i+1])<<4 | unhex(rawQuery[i+2]); unreserved(v) {
				b = append(b, v)
			} else {
				b = append(b, '%', upperHex(rawQuery[i+1]), upperHex(rawQuery[i+2]))
			}
			i += 2
			continue
		}
		b = append(b, rawQuery[i])
	}
	return b
}

func unreserved(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// unhex is a hex digit's value (c is one: isHex).
func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func upperHex(c byte) byte {
	if c >= 'a' {
		return c - 'a' + 'A'
	}
	return c
}

// CanonicalBody is the body's canonical form: RFC 8785 JSON if the body
// is JSON (less the excluded fields: top-level names or dotted paths),
// else the bytes as they are; an empty (or blank) body is empty.
func CanonicalBody(body []byte, excludeFields []string) []byte {
	c := newCanonicaliser()
	defer c.release()
	if !c.body(body, excludeFields) {
		return body
	}
	if len(c.out) == 0 {
		return nil
	}
	return bytes.Clone(c.out)
}

// canonicaliser writes RFC 8785 JSON straight from the text, in one pass
// that also validates it as encoding/json does: no tree of maps and
// interfaces, no copy of a string without escapes. An object's members
// are written as they come, and only put in order (or rid of a repeated
// name) when they did not come in order. Its buffers go back to a pool,
// so that a request's fingerprint takes no allocation but its result.
type canonicaliser struct {
	in      []byte
	pos     int
	out     []byte
	scratch []byte   // an object's members while they are put in order
	names   []byte   // the strings with escapes, decoded
	members []member // the members of the objects open, outermost first
}

// member is an object's member written in out[start:end] as `"name":value`.
type member struct {
	name       []byte // decoded: a slice of the text, or of names
	start, end int
}

// encoding/json's limit (its scanner's maxNestingDepth): a deeper body is
// no JSON to it, so its bytes as they are.
const maxNesting = 10000

var canonicalisers = sync.Pool{New: func() any { return new(canonicaliser) }}

func newCanonicaliser() *canonicaliser {
	c := canonicalisers.Get().(*canonicaliser)
	c.out = c.out[:0]
	return c
}

func (c *canonicaliser) release() {
	// Neither the body nor a large buffer stays with the pool.
	c.in = nil
	clear(c.members[:cap(c.members)])
	if cap(c.out) > 64<<10 || cap(c.scratch) > 64<<10 || cap(c.names) > 64<<10 {
		return
	}
	canonicalisers.Put(c)
}

// body appends CanonicalBody(body, excludeFields) to c.out and returns
// true, or returns false (c.out as it was) when that is the body as it is.
func (c *canonicaliser) body(body []byte, excludeFields []string) bool {
	if len(bytes.TrimSpace(body)) == 0 {
		return true
	}
	if !utf8.Valid(body) {
		return false
	}
	var paths [][]string
	for _, f := range excludeFields {
		paths = append(paths, strings.Split(f, "."))
	}
	mark := len(c.out)
	c.in, c.pos = body, 0
	c.scratch, c.names, c.members = c.scratch[:0], c.names[:0], c.members[:0]
	if c.value(0, paths) && c.skipSpace() == len(body) {
		return true
	}
	c.out = c.out[:mark] // not JSON, or more than one value
	return false
}

func (c *canonicaliser) skipSpace() int {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return c.pos
		}
	}
	return c.pos
}

// value writes the value at c.pos, in depth containers; paths are the
// excluded fields that apply if it is an object, each from its next name.
func (c *canonicaliser) value(depth int, paths [][]string) bool {
	if c.skipSpace() == len(c.in) {
		return false
	}
	switch c.in[c.pos] {
	case '{':
		return c.object(depth+1, paths)
	case '[':
		return c.array(depth + 1)
	case '"':
		_, ok := c.str()
		return ok
	case 't':
		return c.literal("true")
	case 'f':
		return c.literal("false")
	case 'n':
		return c.literal("null")
	}
	return c.number()
}

func (c *canonicaliser) literal(s string) bool {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(s)) {
		return false
	}
	c.pos += len(s)
	c.out = append(c.out, s...)
	return true
}

func (c *canonicaliser) array(depth int) bool {
	if depth > maxNesting {
		return false
	}
	c.pos++
	c.out = append(c.out, '[')
	if c.skipSpace() < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		return true
	}
	for {
		if !c.value(depth, nil) || c.skipSpace() == len(c.in) {
			return false
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			return true
		default:
			return false
		}
	}
}

func (c *canonicaliser) object(depth int, paths [][]string) bool {
	if depth > maxNesting {
		return false
	}
	c.pos++
	start, base, names := len(c.out), len(c.members), len(c.names)
	c.out = append(c.out, '{')
	if c.skipSpace() < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		return true
	}
	inOrder := true
	for {
		if c.skipSpace() == len(c.in) || c.in[c.pos] != '"' {
			return false
		}
		sep := len(c.out)
		if len(c.members) > base {
			c.out = append(c.out, ',')
		}
		at := len(c.out)
		name, ok := c.str()
		if !ok || c.skipSpace() == len(c.in) || c.in[c.pos] != ':' {
			return false
		}
		c.pos++
		c.out = append(c.out, ':')
		// The excluded fields (as encoding/json's decoded map would lose
		// them): a path that ends at this name drops the member (its value
		// still read, as it must be valid JSON); one that goes on applies
		// to the value.
		dropped := false
		var sub [][]string
		for _, p := range paths {
			if p[0] == string(name) {
				if len(p) == 1 {
					dropped = true
				} else {
					sub = append(sub, p[1:])
				}
			}
		}
		if !c.value(depth, sub) {
			return false
		}
		if dropped {
			c.out = c.out[:sep]
		} else {
			if len(c.members) > base && utf16Compare(c.members[len(c.members)-1].name, name) >= 0 {
				inOrder = false
			}
			c.members = append(c.members, member{name, at, len(c.out)})
		}
		if c.skipSpace() == len(c.in) {
			return false
		}
		if c.in[c.pos] == ',' {
			c.pos++
			continue
		}
		if c.in[c.pos] != '}' {
			return false
		}
		c.pos++
		break
	}
	if inOrder {
		c.out = append(c.out, '}')
	} else {
		c.order(start, c.members[base:])
	}
	c.members, c.names = c.members[:base], c.names[:names]
	return true
}

// order rewrites the object in out[start:] with its members (ms) sorted by
// their names' UTF-16 code units; of a name given more than once, the last
// member stays (as in encoding/json's map).
func (c *canonicaliser) order(start int, ms []member) {
	slices.SortStableFunc(ms, func(a, b member) int { return utf16Compare(a.name, b.name) })
	c.scratch = append(c.scratch[:0], c.out[start:]...)
	c.out = append(c.out[:start], '{')
	for i, m := range ms {
		if i+1 < len(ms) && bytes.Equal(ms[i+1].name, m.name) {
			continue
		}
		if len(c.out) > start+1 {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, c.scratch[m.start-start:m.end-start]...)
	}
	c.out = append(c.out, '}')
}

// str writes the string at c.pos and returns its value. Without escapes,
// its canonical form is its text (the text is valid UTF-8, and has no
// control character, quote or backslash to escape), and its value a slice
// of it; with escapes, its value is decoded as encoding/json decodes it
// (a surrogate \u escape not in a pair becomes U+FFFD) into c.names.
func (c *canonicaliser) str() ([]byte, bool) {
	in := c.in
	i := c.pos + 1
	for ; i < len(in); i++ {
		if b := in[i]; b == '"' {
			c.out = append(c.out, in[c.pos:i+1]...)
			v := in[c.pos+1 : i]
			c.pos = i + 1
			return v, true
		} else if b == '\\' {
			break
		} else if b < 0x20 {
			return nil, false
		}
	}
	at := len(c.names)
	c.names = append(c.names, in[c.pos+1:i]...)
	for i < len(in) {
		b := in[i]
		switch {
		case b == '"':
			c.pos = i + 1
			v := c.names[at:]
			c.out = appendCanonicalString(c.out, v)
			return v, true
		case b < 0x20:
			return nil, false
		case b != '\\':
			c.names = append(c.names, b)
			i++
			continue
		}
		if i+1 == len(in) {
			return nil, false
		}
		switch in[i+1] {
		case '"', '\\', '/':
			c.names = append(c.names, in[i+1])
		case 'b':
			c.names = append(c.names, '\b')
		case 'f':
			c.names = append(c.names, '\f')
		case 'n':
			c.names = append(c.names, '\n')
		case 'r':
			c.names = append(c.names, '\r')
		case 't':
			c.names = append(c.names, '\t')
		case 'u':
			r := u4(in[i:])
			if r < 0 {
				return nil, false
			}
			i += 6
			if utf16.IsSurrogate(r) {
				if d := utf16.DecodeRune(r, u4(in[i:])); d != unicode.ReplacementChar {
					r = d
					i += 6
				} else {
					r = unicode.ReplacementChar
				}
			}
			c.names = utf8.AppendRune(c.names, r)
			continue
		default:
			return nil, false
		}
		i += 2
	}
	return nil, false
}

// u4 is the code unit of the \uXXXX escape s begins with, or -1.
func u4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		if !isHex(c) {
			return -1
		}
		r = r<<4 | rune(unhex(c))
	}
	return r
}

// number writes the number at c.pos (JSON's grammar) as an IEEE 754
// double written as ECMAScript writes it. An integer of up to 15 digits is
// a double exactly, and written as it is (but -0 as 0).
func (c *canonicaliser) number() bool {
	in, start := c.in, c.pos
	i := start
	if in[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i == len(in) {
		return false
	}
	integer := 1
	if in[i] == '0' {
		i++
	} else if n := digits(); n == 0 {
		return false
	} else {
		integer = n
	}
	plain := true
	if i < len(in) && in[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
		plain = false
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
		plain = false
	}
	c.pos = i
	text := in[start:i]
	switch {
	case plain && string(text) == "-0":
		c.out = append(c.out, '0')
	case plain && integer <= 15:
		c.out = append(c.out, text...)
	default:
		f, err := strconv.ParseFloat(string(text), 64)
		if err != nil && !math.IsInf(f, 0) {
			c.out = append(c.out, "null"...)
		} else {
			c.out = appendESNumber(c.out, f)
		}
	}
	return true
}

// CanonicalJSON writes v (as encoding/json decodes with UseNumber) in RFC
// 8785 (JCS) form: members sorted by their names' UTF-16 code units, no
// insignificant whitespace, numbers as IEEE 754 doubles written as
// ECMAScript writes them, strings as JSON.stringify escapes them.
func CanonicalJSON(v any) string {
	return string(appendCanonicalJSON(nil, v))
}

func appendCanonicalJSON(b []byte, v any) []byte {
	switch x := v.(type) {
	case map[string]any:
		names := make([]string, 0, len(x))
		for k := range x {
			names = append(names, k)
		}
		slices.SortFunc(names, utf16Compare[string])
		b = append(b, '{')
		for i, k := range names {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendCanonicalString(b, k)
			b = append(b, ':')
			b = appendCanonicalJSON(b, x[k])
		}
		return append(b, '}')
	case []any:
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendCanonicalJSON(b, e)
		}
		return append(b, ']')
	case string:
		return appendCanonicalString(b, x)
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil && !math.IsInf(f, 0) {
			return append(b, "null"...)
		}
		return appendESNumber(b, f)
	case float64:
		return appendESNumber(b, x)
	case bool:
		return strconv.AppendBool(b, x)
	}
	return append(b, "null"...)
}

// utf16Compare orders a and b by their UTF-16 code units (RFC 8785
// 3.2.3), an invalid UTF-8 byte counting as U+FFFD. That is the order of
// the code points but where one is supplementary (a surrogate pair,
// D800-DBFF first) and the other is in U+E000-U+FFFF: then the
// supplementary one is first. The common prefix is skipped byte by byte.
func utf16Compare[T string | []byte](a, b T) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	if i < len(a) && i < len(b) && a[i] < utf8.RuneSelf && b[i] < utf8.RuneSelf {
		return int(a[i]) - int(b[i]) // (an ASCII byte is a character of its own)
	}
	// Back to where a character starts in both (a byte that is no
	// continuation byte starts one, valid or not; so do both ends).
	for i > 0 && !(startsRune(a, i) && startsRune(b, i)) {
		i--
	}
	ia, ib := i, i
	for ia < len(a) && ib < len(b) {
		ra, na := utf8.DecodeRuneInString(string(a[ia:min(ia+utf8.UTFMax, len(a))]))
		rb, nb := utf8.DecodeRuneInString(string(b[ib:min(ib+utf8.UTFMax, len(b))]))
		if ra != rb {
			if ua, ub := firstUnit(ra), firstUnit(rb); ua != ub {
				return int(ua) - int(ub)
			}
			return int(ra) - int(rb)
		}
		ia, ib = ia+na, ib+nb
	}
	switch {
	case ia < len(a):
		return 1
	case ib < len(b):
		return -1
	}
	return 0
}

func startsRune[T string | []byte](s T, i int) bool { return i == len(s) || utf8.RuneStart(s[i]) }

// firstUnit is r's first UTF-16 code unit.
func firstUnit(r rune) rune {
	if r >= 0x10000 {
		return 0xD800 + (r-0x10000)>>10
	}
	return r
}

// appendCanonicalString escapes as JSON.stringify: \" \\ \b \f \n \r \t,
// other control characters as \u00xx, everything else as it is (an
// invalid UTF-8 byte as U+FFFD).
func appendCanonicalString[T string | []byte](b []byte, s T) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, n := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
			if r == utf8.RuneError && n == 1 {
				b = append(b, s[start:i]...)
				b = append(b, "\uFFFD"...)
				start = i + 1
			}
			i += n
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		b = append(b, s[start:i]...)
		b = appendEscapedASCII(b, c)
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendESNumber writes a double as ECMAScript's Number::toString (RFC 8785
// 3.2.2.3): the shortest digits that round-trip, plain from 1e-6 to 1e21.
// Infinite values (a number beyond the double range) are written null, as
// JSON.stringify does.
func appendESNumber(b []byte, x float64) []byte {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return append(b, "null"...)
	}
	if x == 0 {
		return append(b, '0')
	}
	if x < 0 {
		b = append(b, '-')
		x = -x
	}
	// d.ddddde±nn: the shortest round-trip digits and the exponent
	var buf, dbuf [32]byte
	e := strconv.AppendFloat(buf[:0], x, 'e', -1, 64)
	at := bytes.IndexByte(e, 'e')
	digits := append(dbuf[:0], e[0])
	if at > 1 {
		digits = append(digits, e[2:at]...)
	}
	exp := 0
	for _, d := range e[at+2:] {
		exp = exp*10 + int(d-'0')
	}
	if e[at+1] == '-' {
		exp = -exp
	}
	k := len(digits)
	n := exp + 1 // the decimal point's position after the first n digits
	switch {
	case k <= n && n <= 21:
		b = append(b, digits...)
		for ; k < n; k++ {
			b = append(b, '0')
		}
		return b
	case 0 < n && n <= 21:
		b = append(b, digits[:n]...)
		b = append(b, '.')
		return append(b, digits[n:]...)
	case -6 < n && n <= 0:
		b = append(b, '0', '.')
		for i := n; i < 0; i++ {
			b = append(b, '0')
		}
		return append(b, digits...)
	}
	b = append(b, digits[0])
	if k > 1 {
		b = append(b, '.')
		b = append(b, digits[1:]...)
	}
	b = append(b, 'e')
	if n-1 < 0 {
		b = append(b, '-')
	} else {
		b = append(b, '+')
	}
	return strconv.AppendInt(b, int64(abs(n-1)), 10)
}

func abs(i int) int {
	if i < 0 {
		return -i
	}
	return i
}
