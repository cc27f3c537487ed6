package dev.idem.spring.web;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;

/**
 * The response document given to idem_complete / idem_fail, the same as the
 * other clients': the status, the stored headers as [name, value] pairs, the
 * body as UTF-8 text ("body") or base64 ("body_b64"), or "body_stored":
 * false for a body over the limit. Read back, it also accepts the Node
 * client's document and docs/http.md's SQL handler's (headers as an object,
 * a JSON body), so that one key space can be served by any of them.
 */
record StoredResponse(int status, List<String[]> headers, byte[] body) {

    static String document(int status, List<String[]> headers, byte[] body, int maxBody) {
        StringBuilder b = new StringBuilder("{\"status\":").append(status).append(",\"headers\":[");
        for (int i = 0; i < headers.size(); i++) {
            if (i > 0) b.append(',');
            b.append('[');
            Json.string(b, headers.get(i)[0]);
            b.append(',');
            Json.string(b, headers.get(i)[1]);
            b.append(']');
        }
        b.append(']');
        String text = body.length > maxBody ? null : utf8(body);
        if (body.length > maxBody) {
            b.append(",\"body_stored\":false");
        } else if (text != null) {
            b.append(",\"body\":");
            Json.string(b, text);
        } else {
            b.append(",\"body_b64\":");
            Json.string(b, Base64.getEncoder().encodeToString(body));
        }
        return b.append('}').toString();
    }

    /** The stored response, or null when the document is none (NULL, or other code's own result). */
    static StoredResponse read(String document) {
        if (document == null) return null;
        Object parsed;
        try {
            parsed = Json.parse(document);
        } catch (IllegalArgumentException e) {
            return null;
        }
        if (!(parsed instanceof Map<?, ?> doc) || !(doc.get("status") instanceof Json.Num n)) return null;
        double st = n.value();
        if (st != Math.rint(st) || st < 100 || st > 599) return null;
        List<String[]> headers = new ArrayList<>();
        Object h = doc.get("headers");
        if (h instanceof List<?> pairs) {
            for (Object p : pairs) {
                if (p instanceof List<?> pair && pair.size() == 2 && pair.get(0) instanceof String k && pair.get(1) instanceof String v) {
                    headers.add(new String[] {k, v});
                }
            }
        } else if (h instanceof Map<?, ?> object) {
            for (Map.Entry<?, ?> e : object.entrySet()) {
                if (e.getValue() instanceof String v) {
                    headers.add(new String[] {(String) e.getKey(), v});
                } else if (e.getValue() instanceof List<?> many) {
                    for (Object v : many) if (v instanceof String s) headers.add(new String[] {(String) e.getKey(), s});
                }
            }
        }
        byte[] body = new byte[0];
        Object b64 = doc.get("body_b64");
        Object text = doc.get("body");
        try {
            if (b64 instanceof String s) {
                body = Base64.getDecoder().decode(s);
            } else if (text == null || text == Json.NULL) {
                // no body
            } else if (text instanceof String s) {
                body = "base64".equals(doc.get("encoding")) ? Base64.getDecoder().decode(s) : s.getBytes(StandardCharsets.UTF_8);
            } else {
                // A JSON value (docs/http.md's SQL handler stores the body as jsonb).
                body = Json.canonical(text).getBytes(StandardCharsets.UTF_8);
                if (headers.stream().noneMatch(x -> x[0].equalsIgnoreCase("Content-Type"))) {
                    headers.add(new String[] {"Content-Type", "application/json"});
                }
            }
        } catch (IllegalArgumentException e) {
            return null; // bad base64
        }
        return new StoredResponse((int) st, headers, body);
    }

    private static String utf8(byte[] body) {
        try {
            return StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(body)).toString();
        } catch (CharacterCodingException e) {
            return null;
        }
    }
}
