package idem

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// toDocument is the document given to idem_complete / idem_fail, the same
// as the Python client's: the status, the stored headers as [name, value]
// pairs, the body as UTF-8 text ("body") or base64 ("body_b64"), or
// "body_stored": false for a body over MaxStoredBody. It is written here
// byte for byte as encoding/json would marshal it (members in this order,
// strings escaped as its appendString does; reference_test.go holds it to
// that), since marshalling a struct by reflection for every stored
// response cost more than the rest of building it.
func toDocument(status int, h http.Header, body []byte, keep []string, maxBody int) json.RawMessage {
	// One allocation for a typical answer: room for the status and a few
	// short headers, and for the body as base64 or with a little escaping.
	room := 128
	if len(body) <= maxBody {
		room += len(body) + len(body)/3
	}
	b := make([]byte, 0, room)
	b = append(b, `{"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"headers":[`...)
	pairs := 0
	for _, name := range keep {
		for _, v := range h.Values(name) {
			if pairs > 0 {
				b = append(b, ',')
			}
			pairs++
			b = append(b, '[')
			b = appendJSONString(b, http.CanonicalHeaderKey(name))
			b = append(b, ',')
			b = appendJSONString(b, v)
			b = append(b, ']')
		}
	}
	b = append(b, ']')
	switch {
	case len(body) > maxBody:
		b = append(b, `,"body_stored":false`...)
	case utf8.Valid(body):
		b = append(b, `,"body":`...)
		b = appendJSONString(b, body)
	default:
		b = append(b, `,"body_b64":"`...)
		b = base64.StdEncoding.AppendEncode(b, body)
		b = append(b, '"')
	}
	return append(b, '}')
}

// appendJSONString writes s as encoding/json's Marshal does (HTML
// escaping on): \" \\ \b \f \n \r \t, other control characters and < > &
// as \u00xx, an invalid UTF-8 byte as \ufffd, U+2028 and U+2029 as \u2028
// and \u2029; everything else as it is.
func appendJSONString[T string | []byte](b []byte, s T) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			b = appendEscapedASCII(b, c)
			i++
			start = i
			continue
		}
		r, n := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
		switch {
		case r == utf8.RuneError && n == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += n
			continue
		}
		i += n
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// replayable is a stored response read back. It reads the Python client's
// document, the Node client's ({headers: {name: value}, body, encoding:
// "base64", body_omitted}) and docs/http.md's SQL handler's (a JSON body),
// so that one key space can be served by any of them.
type replayable struct {
	status int
	header http.Header
	body   []byte
}

func fromDocument(raw json.RawMessage) (*replayable, bool) {
	var doc struct {
		Status     *int            `json:"status"`
		Headers    json.RawMessage `json:"headers"`
		Body       json.RawMessage `json:"body"`
		BodyB64    *string         `json:"body_b64"`
		Encoding   string          `json:"encoding"`
		BodyStored *bool           `json:"body_stored"`
	}
	if raw == nil || json.Unmarshal(raw, &doc) != nil || doc.Status == nil || *doc.Status < 100 || *doc.Status > 599 {
		return nil, false
	}
	r := &replayable{status: *doc.Status, header: http.Header{}}
	var pairs [][]string
	var object map[string]json.RawMessage
	if json.Unmarshal(doc.Headers, &pairs) == nil {
		for _, p := range pairs {
			if len(p) == 2 {
				r.header.Add(p[0], p[1])
			}
		}
	} else if json.Unmarshal(doc.Headers, &object) == nil {
		for name, v := range object {
			var one string
			var many []string
			if json.Unmarshal(v, &one) == nil {
				r.header.Add(name, one)
			} else if json.Unmarshal(v, &many) == nil {
				for _, s := range many {
					r.header.Add(name, s)
				}
			}
		}
	}
	var text string
	switch {
	case doc.BodyB64 != nil:
		b, err := base64.StdEncoding.DecodeString(*doc.BodyB64)
		if err != nil {
			return nil, false
		}
		r.body = b
	case len(doc.Body) == 0 || string(doc.Body) == "null":
	case json.Unmarshal(doc.Body, &text) == nil:
		if doc.Encoding == "base64" {
			b, err := base64.StdEncoding.DecodeString(text)
			if err != nil {
				return nil, false
			}
			r.body = b
		} else {
			r.body = []byte(text)
		}
	default:
		// A JSON value (docs/http.md's SQL handler stores the body as jsonb).
		r.body = []byte(doc.Body)
		if r.header.Get("Content-Type") == "" {
			r.header.Set("Content-Type", "application/json")
		}
	}
	return r, true
}

// appendEscapedASCII writes an ASCII byte that a JSON string escapes (", \,
// a control character; < > & in encoding/json's HTML escaping) as both
// JSON.stringify and encoding/json write it.
func appendEscapedASCII(b []byte, c byte) []byte {
	const hex = "0123456789abcdef"
	switch c {
	case '"', '\\':
		return append(b, '\\', c)
	case '\b':
		return append(b, '\\', 'b')
	case '\f':
		return append(b, '\\', 'f')
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	}
	return append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
}
