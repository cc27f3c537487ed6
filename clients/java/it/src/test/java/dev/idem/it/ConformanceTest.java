package dev.idem.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicContainer;
import org.junit.jupiter.api.DynamicNode;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * The Java runner of the shared conformance table
 * (tests/middleware/conformance.json; its format in tests/middleware/README.md):
 * every case against the conformance server's jar (java -jar; the
 * Idempotency-Key filter on Spring MVC), connected to the database directly
 * and through PgBouncer in transaction mode (-Didem.it.pgbouncer=host:port;
 * -Didem.it.conformance-via=direct for the first only),
 * with a real HTTP client; the business rows counted on the test's own
 * connection. Then 20 concurrent duplicates against each: one row, one
 * answer. Every wait is for a state the database shows.
 */
class ConformanceTest {
    static final ObjectMapper JSON = new ObjectMapper();
    static final HttpClient HTTP = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
    static JsonNode table;
    static Connection db;
    static final Map<String, ExampleApp> servers = new LinkedHashMap<>();

    @BeforeAll
    static void start() throws Exception {
        table = JSON.readTree(Path.of(required("idem.it.conformance")).toFile());
        assertEquals(1, table.get("format").asInt(), "the table's format");
        knownFields("table", table);
        String direct = TestDatabase.jdbcUrl();
        db = DriverManager.getConnection(direct + "&ApplicationName=idem-conformance-runner");
        String[] bouncer = System.getProperty("idem.it.pgbouncer", ":").split(":");
        // PgBouncer 1.18 in transaction mode keeps no named prepared statements: pgJDBC without them.
        String pooled = "jdbc:postgresql://" + bouncer[0] + ":" + bouncer[1] + "/" + required("idem.it.database") + "?user=postgres&prepareThreshold=0";
        // -Didem.it.conformance-via: which of the two (default both; they start at once).
        List<String> via = List.of(System.getProperty("idem.it.conformance-via", "direct,pgbouncer").split(","));
        Map<String, String> urls = new LinkedHashMap<>();
        if (via.contains("direct")) urls.put("direct", direct);
        if (via.contains("pgbouncer")) urls.put("pgbouncer", pooled);
        ExecutorService starter = Executors.newFixedThreadPool(2);
        Map<String, Future<ExampleApp>> starting = new LinkedHashMap<>();
        for (Map.Entry<String, String> e : urls.entrySet()) {
            starting.put(e.getKey(), starter.submit(() -> new ExampleApp(required("idem.it.conformance-jar"),
                    List.of("--spring.datasource.url=" + e.getValue() + "&ApplicationName=idem-conformance-" + e.getKey(),
                            "--idem.http.problem-base=" + table.get("problem_base").asText(),
                            // A duplicate's wait for the first request is a bound against a hang
                            // here, not a verdict (the short-wait route has its own 200 ms): at
                            // 5 s, 20 duplicates got 409 on a loaded machine while the first ran.
                            "--idem.http.lock-timeout=60s"),
                    ExampleApp.logFile("conformance-" + e.getKey()))));
        }
        for (Map.Entry<String, Future<ExampleApp>> e : starting.entrySet()) servers.put(e.getKey(), e.getValue().get());
        starter.shutdown();
    }

    @AfterAll
    static void stop() throws Exception {
        for (ExampleApp app : servers.values()) app.close();
        if (db != null) db.close();
    }

    static String required(String name) {
        String v = System.getProperty(name);
        if (v == null || v.isEmpty()) throw new IllegalStateException("-D" + name + " is required (tests/scenarios/clients.sh java_spring)");
        return v;
    }

    @TestFactory
    Stream<DynamicNode> conformanceTable() {
        List<DynamicNode> out = new ArrayList<>();
        for (Map.Entry<String, ExampleApp> server : servers.entrySet()) {
            List<DynamicNode> cases = new ArrayList<>();
            for (JsonNode c : table.get("cases")) {
                cases.add(DynamicTest.dynamicTest(c.get("name").asText(), () -> runCase(server.getValue().port(), c)));
            }
            out.add(DynamicContainer.dynamicContainer(server.getKey(), cases));
        }
        return out.stream();
    }

    @TestFactory
    Stream<DynamicNode> twentyConcurrentDuplicatesMakeOneRow() {
        return servers.entrySet().stream().map(server -> DynamicTest.dynamicTest(server.getKey(), () -> {
            String u = runId();
            JsonNode c = JSON.readTree("{\"requests\":[]}");
            HttpRequest request = request(server.getValue().port(), c, JSON.readTree("{\"key\":[\"\\\"{u}-twenty\\\"\"]}"), u, false);
            List<CompletableFuture<HttpResponse<String>>> sent = new ArrayList<>();
            for (int i = 0; i < 20; i++) sent.add(HTTP.sendAsync(request, HttpResponse.BodyHandlers.ofString()));
            Set<String> bodies = new HashSet<>();
            int firsts = 0;
            for (CompletableFuture<HttpResponse<String>> f : sent) {
                HttpResponse<String> r = f.get();
                assertEquals(201, r.statusCode(), r.body());
                bodies.add(r.body());
                if (r.headers().firstValue("Idempotent-Replayed").isEmpty()) firsts++;
            }
            assertEquals(1, rows(u), "business rows of 20 concurrent duplicates");
            assertEquals(1, bodies.size(), "20 duplicates, one answer: " + bodies);
            assertEquals(1, firsts, "one answer is the first, 19 are replays");
        }));
    }

    /**
     * Lease mode beyond the table: a leased request that recorded a recovery
     * point and then failed (503, not stored) hands its lease back; once the
     * database shows the lease ran out (idem_leases: at once after the
     * release), the retry takes it over as attempt 2 with that point and its
     * data, runs, is stored, and is replayed; one business row.
     */
    @TestFactory
    Stream<DynamicNode> leaseTakeoverGetsTheRecoveryPoint() {
        return servers.entrySet().stream().map(server -> DynamicTest.dynamicTest(server.getKey(), () -> {
            String u = runId();
            int port = server.getValue().port();
            JsonNode c = JSON.readTree("{\"route\":\"/java/lease-takeover\",\"requests\":[]}");
            JsonNode first = JSON.readTree("{\"key\":[\"\\\"{u}-takeover\\\"\"],\"status\":503}");
            HttpRequest failing = HttpRequest.newBuilder(request(port, c, first, u, false), (n, v) -> true)
                    .header("X-Checkpoint", "charged").build();
            HttpResponse<String> r1 = HTTP.send(failing, HttpResponse.BodyHandlers.ofString());
            assertEquals(503, r1.statusCode(), r1.body());
            assertEquals("{\"attempt\":1,\"point\":null,\"data\":null}", JSON.readTree(r1.body()).get("given").toString(), r1.body());
            for (int i = 0; ; i++) { // until the database says the lease ran out (a bound against a hang only)
                try (PreparedStatement st = db.prepareStatement("SELECT ran_out FROM idem_leases WHERE biz_type = 'java.lease' AND key LIKE ?")) {
                    st.setString(1, "%:" + u + "-takeover");
                    try (ResultSet rs = st.executeQuery()) {
                        assertTrue(rs.next(), "the failed attempt's lease is live");
                        if (rs.getBoolean(1)) break;
                    }
                }
                assertTrue(i < 2400, "the 1 s lease never ran out");
                Thread.sleep(50);
            }
            JsonNode retry = JSON.readTree("{\"key\":[\"\\\"{u}-takeover\\\"\"]}");
            HttpResponse<String> r2 = HTTP.send(request(port, c, retry, u, false), HttpResponse.BodyHandlers.ofString());
            assertEquals(201, r2.statusCode(), r2.body());
            assertEquals("{\"attempt\":2,\"point\":\"charged\",\"data\":{\"n\":1}}", JSON.readTree(r2.body()).get("given").toString(), r2.body());
            HttpResponse<String> r3 = HTTP.send(request(port, c, retry, u, false), HttpResponse.BodyHandlers.ofString());
            assertEquals(201, r3.statusCode(), r3.body());
            assertEquals(r2.body(), r3.body());
            assertEquals("true", r3.headers().firstValue("Idempotent-Replayed").orElse(null));
            assertEquals(1, rows(u), "business rows: the failed attempt's rolled back, the takeover's committed");
        }));
    }

    // ---- one case -------------------------------------------------------------

    static final Pattern REPEAT_X = Pattern.compile("\\{x\\*(\\d+)\\}");

    static String fill(String s, String u) {
        s = s.replace("{u}", u);
        Matcher m = REPEAT_X.matcher(s);
        StringBuilder b = new StringBuilder();
        while (m.find()) m.appendReplacement(b, "x".repeat(Integer.parseInt(m.group(1))));
        return m.appendTail(b).toString();
    }

    /** The fields of the table's format this runner checks (tests/middleware/README.md, "The format"). */
    static final Map<String, Set<String>> KNOWN = Map.of(
            "table", Set.of("format", "about", "problem_base", "problems", "defaults", "canonical_json", "canonical_body",
                    "canonical_target", "cases"),
            "case", Set.of("name", "rule", "requires", "route", "configure", "seed", "requests", "rows"),
            "configure", Set.of("biz_type", "on_failure"),
            "seed", Set.of("claim", "biz_type", "state", "result"),
            "request", Set.of("key", "tenant", "body", "content_type", "route", "query", "status", "fail", "pad", "hold", "after_release", "expect"),
            "expect", Set.of("status", "replayed", "ran", "same_as", "headers", "problem", "expires"));

    /** The features a case may require (its "requires") that the Java filter has; another fails the case. */
    static final Set<String> FEATURES = Set.of("idempotent-expires");

    /** A case with a field this runner does not know fails: a check it would leave out must not pass unseen. */
    static void knownFields(String what, JsonNode node) {
        node.fieldNames().forEachRemaining(f -> assertTrue(KNOWN.get(what).contains(f),
                "the Java runner does not know the field \"" + f + "\" of a " + what + " (tests/middleware/README.md): teach it"));
    }

    static String runId() {
        byte[] b = new byte[6];
        new SecureRandom().nextBytes(b);
        return HexFormat.of().formatHex(b);
    }

    static HttpRequest request(int port, JsonNode c, JsonNode rq, String u, boolean hold) {
        JsonNode defaults = table.get("defaults");
        String route = rq.hasNonNull("route") ? rq.get("route").asText()
                : c.hasNonNull("route") ? c.get("route").asText() : defaults.get("route").asText();
        String target = "http://127.0.0.1:" + port + route + (rq.hasNonNull("query") ? "?" + rq.get("query").asText() : "");
        String body = rq.has("body") ? rq.get("body").asText() : defaults.get("body").asText();
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(target))
                .header("Content-Type", rq.hasNonNull("content_type") ? rq.get("content_type").asText() : "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(fill(body, u)));
        if (rq.has("key")) for (JsonNode line : rq.get("key")) b.header("Idempotency-Key", fill(line.asText(), u));
        if (!rq.has("tenant")) {
            b.header("X-Tenant", defaults.get("tenant").asText());
        } else if (!rq.get("tenant").isNull()) {
            b.header("X-Tenant", fill(rq.get("tenant").asText(), u));
        }
        if (rq.has("status")) b.header("X-Conformance-Status", rq.get("status").asText());
        if (rq.has("fail")) b.header("X-Conformance-Fail", rq.get("fail").asText());
        if (rq.has("pad")) b.header("X-Conformance-Pad", rq.get("pad").asText());
        if (hold) b.header("X-Conformance-Hold", u);
        return b.build();
    }

    static void runCase(int port, JsonNode c) throws Exception {
        knownFields("case", c);
        for (JsonNode f : c.path("requires")) {
            assertTrue(FEATURES.contains(f.asText()), "the case requires \"" + f.asText() + "\", which the Java filter does not have");
        }
        if (c.has("configure")) knownFields("configure", c.get("configure"));
        if (c.has("seed")) knownFields("seed", c.get("seed"));
        for (JsonNode rq : c.get("requests")) {
            knownFields("request", rq);
            knownFields("expect", rq.get("expect"));
        }
        String u = runId();
        JsonNode requests = c.get("requests");
        List<HttpResponse<String>> got = new ArrayList<>();
        for (int i = 0; i < requests.size(); i++) got.add(null);
        List<Long> ids = new ArrayList<>();
        if (c.has("configure")) {
            // The business type's failure policy (its TTL the default), before the requests.
            exec(db, "SELECT idem_configure(?, NULL, ?)", c.get("configure").get("biz_type").asText(),
                    c.get("configure").get("on_failure").asText());
        }
        if (c.has("seed")) seed(c.get("seed"), u);
        try (Connection holdConn = DriverManager.getConnection(TestDatabase.jdbcUrl() + "&ApplicationName=idem-conformance-hold")) {
            int held = -1;
            CompletableFuture<HttpResponse<String>> heldAnswer = null;
            for (int i = 0; i < requests.size(); i++) {
                JsonNode rq = requests.get(i);
                if (rq.path("after_release").asBoolean()) continue;
                if (rq.path("hold").asBoolean()) {
                    exec(holdConn, "SELECT pg_advisory_lock(hashtext(?))", u);
                    held = i;
                    heldAnswer = HTTP.sendAsync(request(port, c, rq, u, true), HttpResponse.BodyHandlers.ofString());
                    awaitWaiter(u);
                    continue;
                }
                got.set(i, HTTP.send(request(port, c, rq, u, false), HttpResponse.BodyHandlers.ofString()));
                check(rq, got, ids, i);
            }
            if (held >= 0) {
                exec(holdConn, "SELECT pg_advisory_unlock(hashtext(?))", u);
                got.set(held, heldAnswer.get());
                check(requests.get(held), got, ids, held);
            }
        }
        for (int i = 0; i < requests.size(); i++) {
            JsonNode rq = requests.get(i);
            if (!rq.path("after_release").asBoolean()) continue;
            got.set(i, HTTP.send(request(port, c, rq, u, false), HttpResponse.BodyHandlers.ofString()));
            check(rq, got, ids, i);
        }
        assertEquals(c.get("rows").asInt(), rows(u), "business rows committed");
    }

    static void check(JsonNode rq, List<HttpResponse<String>> all, List<Long> ids, int i) throws Exception {
        JsonNode e = rq.get("expect");
        HttpResponse<String> r = all.get(i);
        String seen = "request " + i + ": " + r.statusCode() + " " + r.headers().map() + " " + r.body();
        boolean replayed = "true".equals(r.headers().firstValue("Idempotent-Replayed").orElse(null));
        if (e.has("problem")) {
            String slug = e.get("problem").asText();
            JsonNode p = table.get("problems").get(slug);
            int status = p.get(0).asInt();
            assertEquals(status, r.statusCode(), seen);
            assertEquals("application/problem+json", r.headers().firstValue("Content-Type").orElse(null), seen);
            JsonNode doc = JSON.readTree(r.body());
            assertEquals(table.get("problem_base").asText() + slug, doc.path("type").asText(), seen);
            assertEquals(p.get(1).asText(), doc.path("title").asText(), seen);
            assertEquals(status, doc.path("status").asInt(), seen);
            assertTrue(doc.path("detail").isTextual() && !doc.path("detail").asText().isEmpty(), seen);
            assertTrue(!replayed, seen);
        }
        if (e.has("status")) assertEquals(e.get("status").asInt(), r.statusCode(), seen);
        if (e.has("replayed")) assertEquals(e.get("replayed").asBoolean(), replayed, seen);
        Long id = null;
        try {
            JsonNode body = JSON.readTree(r.body());
            if (body != null && body.path("id").asLong() != 0) id = body.path("id").asLong();
        } catch (Exception notJson) {
            // a body that is not JSON has no id
        }
        if (e.path("ran").asBoolean()) {
            assertTrue(id != null, "the handler should have run: " + seen);
            assertTrue(!ids.contains(id), "id " + id + " was seen before: the handler did not run: " + seen);
        }
        if (id != null) ids.add(id);
        if (e.has("same_as")) {
            HttpResponse<String> first = all.get(e.get("same_as").asInt());
            assertEquals(first.body(), r.body(), seen);
            for (String h : List.of("Content-Type", "Location")) {
                assertEquals(first.headers().firstValue(h), r.headers().firstValue(h), h + ": " + seen);
            }
        }
        if (e.has("expires")) {
            // Idempotent-Expires: absent, or an IMF-fixdate in the future.
            java.util.Optional<String> v = r.headers().firstValue("Idempotent-Expires");
            if (!e.get("expires").asBoolean()) {
                assertTrue(v.isEmpty(), "Idempotent-Expires should be absent: " + seen);
            } else {
                assertTrue(v.isPresent(), "no Idempotent-Expires: " + seen);
                java.time.ZonedDateTime when = java.time.ZonedDateTime.parse(v.get(), java.time.format.DateTimeFormatter
                        .ofPattern("EEE, dd MMM yyyy HH:mm:ss 'GMT'", java.util.Locale.US).withZone(java.time.ZoneOffset.UTC));
                assertTrue(when.toInstant().isAfter(java.time.Instant.now()), "Idempotent-Expires not in the future: " + seen);
            }
        }
        if (e.has("headers")) {
            e.get("headers").fields().forEachRemaining(h -> {
                List<String> vs = r.headers().allValues(h.getKey());
                if (h.getValue().isNull()) {
                    assertTrue(vs.isEmpty(), "header " + h.getKey() + " should be absent: " + seen);
                } else {
                    assertTrue(!vs.isEmpty() && vs.get(0).equals(h.getValue().asText()),
                            "header " + h.getKey() + " should be " + h.getValue() + ": " + seen);
                }
            });
        }
    }

    /** A claim finished by other code (a SQL handler, a consumer) before the case's requests. */
    static void seed(JsonNode s, String u) throws Exception {
        String claim = fill(s.get("claim").asText(), u);
        String biz = s.get("biz_type").asText();
        JsonNode result = s.get("result");
        String finish = "completed".equals(s.get("state").asText()) ? "idem_complete" : "idem_fail";
        db.setAutoCommit(false);
        try {
            exec(db, "SELECT idem_claim(?, ?)", claim, biz);
            exec(db, "SELECT " + finish + "(?, ?, ?::jsonb)", claim, biz, result == null || result.isNull() ? null : result.toString());
            db.commit();
        } finally {
            db.rollback();
            db.setAutoCommit(true);
        }
    }

    static void exec(Connection c, String sql, Object... args) throws Exception {
        try (PreparedStatement st = c.prepareStatement(sql)) {
            for (int i = 0; i < args.length; i++) st.setObject(i + 1, args[i]);
            st.execute();
        }
    }

    static long rows(String run) throws Exception {
        try (PreparedStatement st = db.prepareStatement("SELECT count(*) FROM conformance_rows WHERE run = ?")) {
            st.setString(1, run);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    /** Until a backend waits for the advisory lock of hashtext(u): the held request is in its transaction. */
    static void awaitWaiter(String u) throws Exception {
        for (int i = 0; i < 4800; i++) {
            try (PreparedStatement st = db.prepareStatement("SELECT count(*) >= 1 FROM pg_locks WHERE locktype = 'advisory'"
                    + " AND NOT granted AND objid::text::bigint = hashtext(?)::bigint & 4294967295")) {
                st.setString(1, u);
                try (ResultSet rs = st.executeQuery()) {
                    rs.next();
                    if (rs.getBoolean(1)) return;
                }
            }
            Thread.sleep(25);
        }
        throw new AssertionError("the held request never waited for the runner's lock (2 minutes)");
    }
}
