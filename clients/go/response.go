package idem

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"unicode/utf8"
)

// storedResponse is the document given to idem_complete / idem_fail, the
// same as the Python client's: the status, the stored headers as [name,
// value] pairs, the body as UTF-8 text ("body") or base64 ("body_b64"), or
// "body_stored": false for a body over MaxStoredBody.
type storedResponse struct {
	Status     int         `json:"status"`
	Headers    [][2]string `json:"headers"`
	Body       *string     `json:"body,omitempty"`
	BodyB64    *string     `json:"body_b64,omitempty"`
	BodyStored *bool       `json:"body_stored,omitempty"`
}

func toDocument(status int, h http.Header, body []byte, keep []string, maxBody int) storedResponse {
	doc := storedResponse{Status: status, Headers: [][2]string{}}
	for _, name := range keep {
		for _, v := range h.Values(name) {
			doc.Headers = append(doc.Headers, [2]string{http.CanonicalHeaderKey(name), v})
		}
	}
	switch {
	case len(body) > maxBody:
		f := false
		doc.BodyStored = &f
	case utf8.Valid(body):
		s := string(body)
		doc.Body = &s
	default:
		s := base64.StdEncoding.EncodeToString(body)
		doc.BodyB64 = &s
	}
	return doc
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
