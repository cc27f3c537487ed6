package idem

// The stored document as it was built before toDocument wrote it by hand
// (response.go): a struct encoding/json marshals. Kept as the reference.

import (
	"encoding/base64"
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

func refToDocument(status int, h http.Header, body []byte, keep []string, maxBody int) storedResponse {
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
