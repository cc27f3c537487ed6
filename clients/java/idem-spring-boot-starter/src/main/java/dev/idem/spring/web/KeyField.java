package dev.idem.spring.web;

import java.nio.charset.StandardCharsets;

/** The Idempotency-Key field and the key's scope (docs/http.md, "The key field" and "The key scope"). */
public final class KeyField {
    private KeyField() { }

    /** A parsed field: the key, or null and why the field is refused. */
    public record Parsed(String key, String why) { }

    /**
     * Reads a field value (its field lines joined with ", ", as HTTP combines
     * them): exactly one RFC 8941 sf-string without parameters, whose content
     * is minLen to maxLen visible ASCII characters. bareKeys also accepts an
     * unquoted key (visible ASCII without the characters that delimit
     * structured fields).
     */
    public static Parsed parse(String raw, int minLen, int maxLen, boolean bareKeys) {
        String s = trim(raw);
        String key;
        if (!s.isEmpty() && s.charAt(0) == '"') {
            StringBuilder out = new StringBuilder();
            int i = 1;
            while (true) {
                if (i >= s.length()) return new Parsed(null, "the quoted string is not terminated");
                char ch = s.charAt(i);
                if (ch == '\\') {
                    if (i + 1 >= s.length() || (s.charAt(i + 1) != '"' && s.charAt(i + 1) != '\\')) {
                        return new Parsed(null, "a backslash in a quoted string may only escape \" or \\");
                    }
                    out.append(s.charAt(i + 1));
                    i += 2;
                    continue;
                }
                if (ch == '"') break;
                if (ch < 0x20 || ch > 0x7e) return new Parsed(null, "the quoted string holds a character outside printable ASCII");
                out.append(ch);
                i++;
            }
            String rest = trim(s.substring(i + 1));
            if (!rest.isEmpty()) {
                return new Parsed(null, rest.charAt(0) == ',' ? "the field holds more than one value"
                        : "the field holds more than one quoted string");
            }
            key = out.toString();
        } else if (bareKeys && !s.isEmpty() && s.chars().allMatch(KeyField::bareKeyChar)) {
            key = s;
        } else {
            return new Parsed(null, "the value must be one quoted string (RFC 8941 sf-string), e.g. \"8e03978e-40d5-43e8-bc93-6894a57f9324\"");
        }
        if (key.length() < minLen || key.length() > maxLen) {
            return new Parsed(null, "the key has " + key.length() + " characters; it must have " + minLen + " to " + maxLen);
        }
        if (!key.chars().allMatch(c -> c >= 0x21 && c <= 0x7e)) {
            return new Parsed(null, "the key must be visible ASCII characters (no spaces)");
        }
        return new Parsed(key, null);
    }

    /** The scope of a request without a tenant: "-", which no tenant's scope can equal. */
    public static final String SHARED_SCOPE = "-";

    /**
     * A tenant's scope: the UTF-8 length of its name, ":", the name. The
     * length makes the scoped key injective: tenants "a:b" with key k and "a"
     * with key "b:k" claim different keys.
     */
    public static String tenantScope(String tenant) {
        return tenant.getBytes(StandardCharsets.UTF_8).length + ":" + tenant;
    }

    /** The key idem claims: the scope, ":", the client's key. */
    public static String scopedKey(String scope, String key) {
        return scope + ":" + key;
    }

    private static String trim(String s) {
        int a = 0, b = s.length();
        while (a < b && (s.charAt(a) == ' ' || s.charAt(a) == '\t')) a++;
        while (b > a && (s.charAt(b - 1) == ' ' || s.charAt(b - 1) == '\t')) b--;
        return s.substring(a, b);
    }

    private static boolean bareKeyChar(int c) {
        return c >= 0x21 && c <= 0x7e && c != '"' && c != ',' && c != ';' && c != '\\';
    }
}
