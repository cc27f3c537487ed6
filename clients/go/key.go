package idem

import (
	"fmt"
	"strconv"
)

// ParseKeyField reads an Idempotency-Key field value (its field lines
// joined with commas, as HTTP combines them): exactly one RFC 8941
// sf-string without parameters, whose content is minLen to maxLen visible
// ASCII characters. bareKeys also accepts an unquoted key (visible ASCII
// without the characters that delimit structured fields). It returns the
// key, or "" and why the field is refused.
func ParseKeyField(raw string, minLen, maxLen int, bareKeys bool) (key, why string) {
	s := trimSPHT(raw)
	switch {
	case len(s) > 0 && s[0] == '"':
		out := make([]byte, 0, len(s))
		i := 1
		for {
			if i >= len(s) {
				return "", "the quoted string is not terminated"
			}
			ch := s[i]
			if ch == '\\' {
				if i+1 >= len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
					return "", `a backslash in a quoted string may only escape " or \`
				}
				out = append(out, s[i+1])
				i += 2
				continue
			}
			if ch == '"' {
				break
			}
			if ch < 0x20 || ch > 0x7e {
				return "", "the quoted string holds a character outside printable ASCII"
			}
			out = append(out, ch)
			i++
		}
		if rest := trimSPHT(s[i+1:]); rest != "" {
			if rest[0] == ',' {
				return "", "the field holds more than one value"
			}
			return "", "the field holds more than one quoted string"
		}
		key = string(out)
	case bareKeys && s != "" && allBytes(s, isBareKeyChar):
		key = s
	default:
		return "", `the value must be one quoted string (RFC 8941 sf-string), e.g. "8e03978e-40d5-43e8-bc93-6894a57f9324"`
	}
	if len(key) < minLen || len(key) > maxLen {
		return "", fmt.Sprintf("the key has %d characters; it must have %d to %d", len(key), minLen, maxLen)
	}
	if !allBytes(key, func(c byte) bool { return c >= 0x21 && c <= 0x7e }) {
		return "", "the key must be visible ASCII characters (no spaces)"
	}
	return key, ""
}

func trimSPHT(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

func isBareKeyChar(c byte) bool {
	return c >= 0x21 && c <= 0x7e && c != '"' && c != ',' && c != ';' && c != '\\'
}

func allBytes(s string, ok func(byte) bool) bool {
	for i := 0; i < len(s); i++ {
		if !ok(s[i]) {
			return false
		}
	}
	return true
}

// SharedScope is the scope of a request without a tenant (SingleTenant, or
// an anonymous caller): "-", which no tenant's scope "<length>:<tenant>"
// can equal.
const SharedScope = "-"

// TenantScope is the scope of a tenant: the UTF-8 length of its name, ":",
// the name. The length makes the scoped key injective: tenants "a:b" with
// key k and "a" with key "b:k" claim different keys.
func TenantScope(tenant string) string { return strconv.Itoa(len(tenant)) + ":" + tenant }

// ScopedKey is the key idem claims: the scope, ":", the client's key.
func ScopedKey(scope, key string) string { return scope + ":" + key }
