package dev.idem.spring.web;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * The conformance table's pairs (tests/middleware/conformance.json, shared by
 * every idem client; -Didem.it.conformance=PATH): the canonical JSON, body
 * and target of the fingerprint exactly, and the same problem types. No
 * database.
 */
class ConformancePairsTest {
    static JsonNode table() throws Exception {
        String path = System.getProperty("idem.it.conformance", "../../../tests/middleware/conformance.json");
        return new ObjectMapper().readTree(Path.of(path).toFile());
    }

    static String body(String text) {
        return new String(Fingerprint.canonicalBody(text.getBytes(StandardCharsets.UTF_8), null), StandardCharsets.UTF_8);
    }

    @Test
    void canonicalJsonBodyAndTarget() throws Exception {
        JsonNode t = table();
        int n = 0;
        for (String field : new String[] {"canonical_json", "canonical_body"}) {
            for (JsonNode p : t.get(field)) {
                assertEquals(p.get(1).asText(), body(p.get(0).asText()), field + ": " + p.get(0).asText());
                n++;
            }
        }
        // The target as the servlet API gives it: getRequestURI and getQueryString, both as sent.
        for (JsonNode p : t.get("canonical_target")) {
            URI u = URI.create("http://h" + p.get(0).asText());
            assertEquals(p.get(1).asText(), Fingerprint.canonicalTarget(u.getRawPath(), u.getRawQuery()), p.get(0).asText());
            n++;
        }
        assertTrue(n > 30, n + " pairs");
    }

    @Test
    void sameProblemTypes() throws Exception {
        JsonNode problems = table().get("problems");
        assertEquals(problems.size(), IdempotencyKeyFilter.PROBLEMS.size());
        for (Map.Entry<String, Object[]> e : IdempotencyKeyFilter.PROBLEMS.entrySet()) {
            JsonNode p = problems.get(e.getKey());
            assertNotNull(p, e.getKey());
            assertEquals(p.get(0).asInt(), e.getValue()[0], e.getKey());
            assertEquals(p.get(1).asText(), e.getValue()[1], e.getKey());
        }
    }
}
