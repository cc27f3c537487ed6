package dev.idem.spring.web;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;

/**
 * The request fingerprint every idem client computes (docs/http.md, "The
 * fingerprint"): 128 bits of SHA-256 (32 hex digits) over
 * {@code METHOD SP target LF scope LF} and the canonical body. Never the
 * headers: tokens rotate and trace ids change between retries.
 */
public final class Fingerprint {
    private Fingerprint() { }

    public static String of(String method, String rawPath, String rawQuery, String scope, byte[] body, List<String> excludeFields) {
        MessageDigest sha = sha256();
        sha.update((method.toUpperCase(java.util.Locale.ROOT) + " " + canonicalTarget(rawPath, rawQuery) + "\n" + scope + "\n")
                .getBytes(StandardCharsets.UTF_8));
        sha.update(canonicalBody(body, excludeFields));
        return HexFormat.of().formatHex(sha.digest()).substring(0, 32);
    }

    /** SHA-256 looked up in the providers once; a clone per request. */
    private static final MessageDigest SHA256 = newSha256();

    private static MessageDigest newSha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    private static MessageDigest sha256() {
        try {
            return (MessageDigest) SHA256.clone();
        } catch (CloneNotSupportedException e) {
            return newSha256();
        }
    }

    /**
     * The path as sent (the servlet's getRequestURI) decoded once, then every
     * byte but the unreserved characters and "/" percent-encoded in upper-case
     * hex ("%2F" counts as "/"); the query as sent, its escapes normalised
     * (RFC 3986, 6.2.2); "?" only before a query.
     */
    public static String canonicalTarget(String rawPath, String rawQuery) {
        ByteArrayOutputStream decoded = new ByteArrayOutputStream();
        byte[] raw = rawPath.getBytes(StandardCharsets.UTF_8);
        for (int i = 0; i < raw.length; i++) {
            if (raw[i] == '%' && i + 2 < raw.length && hex(raw[i + 1]) >= 0 && hex(raw[i + 2]) >= 0) {
                decoded.write(hex(raw[i + 1]) << 4 | hex(raw[i + 2]));
                i += 2;
            } else {
                decoded.write(raw[i]);
            }
        }
        StringBuilder b = new StringBuilder();
        for (byte x : decoded.toByteArray()) {
            int c = x & 0xff;
            if (unreserved(c) || c == '/') {
                b.append((char) c);
            } else {
                b.append('%').append(HEX[c >> 4]).append(HEX[c & 15]);
            }
        }
        if (rawQuery == null || rawQuery.isEmpty()) return b.toString();
        b.append('?');
        for (int i = 0; i < rawQuery.length(); i++) {
            char c = rawQuery.charAt(i);
            if (c == '%' && i + 2 < rawQuery.length() && hex((byte) rawQuery.charAt(i + 1)) >= 0 && hex((byte) rawQuery.charAt(i + 2)) >= 0) {
                int v = hex((byte) rawQuery.charAt(i + 1)) << 4 | hex((byte) rawQuery.charAt(i + 2));
                if (unreserved(v)) {
                    b.append((char) v);
                } else {
                    b.append('%').append(HEX[v >> 4]).append(HEX[v & 15]);
                }
                i += 2;
            } else {
                b.append(c);
            }
        }
        return b.toString();
    }

    /**
     * The body's canonical form: RFC 8785 JSON if all of it, as UTF-8, is one
     * JSON text (less the excluded fields: top-level names or dotted paths),
     * else its bytes as they are; an empty or blank body is empty.
     */
    public static byte[] canonicalBody(byte[] body, List<String> excludeFields) {
        int start = 0, end = body.length;
        while (start < end && blank(body[start])) start++;
        while (end > start && blank(body[end - 1])) end--;
        if (start == end) return new byte[0];
        String text;
        try {
            text = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(body)).toString();
        } catch (CharacterCodingException e) {
            return body;
        }
        Object v;
        try {
            v = Json.parse(text);
        } catch (IllegalArgumentException e) {
            return body;
        }
        if (excludeFields != null) {
            for (String f : excludeFields) drop(v, f.split("\\."), 0);
        }
        return Json.canonical(v).getBytes(StandardCharsets.UTF_8);
    }

    private static void drop(Object v, String[] path, int at) {
        if (!(v instanceof Map<?, ?> m)) return;
        if (at == path.length - 1) {
            m.remove(path[at]);
        } else {
            drop(m.get(path[at]), path, at + 1);
        }
    }

    private static final char[] HEX = "0123456789ABCDEF".toCharArray();

    private static boolean blank(byte b) {
        return b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == 0x0b || b == '\f';
    }

    private static boolean unreserved(int c) {
        return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~';
    }

    private static int hex(byte c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    }
}
