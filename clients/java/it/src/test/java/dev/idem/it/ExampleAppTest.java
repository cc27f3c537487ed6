package dev.idem.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.regex.Pattern;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * The example application of clients/java/README.md, run from its jar
 * against a database with idem, driven by real HTTP requests; every verdict
 * from the business rows (payments, accounts' balances, orders, events).
 * The database: {@link TestDatabase}.
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class ExampleAppTest {
    static final ObjectMapper JSON = new ObjectMapper();
    static final HttpClient HTTP = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
    static String jdbcUrl;
    static Connection db;
    static ExampleApp app;
    static int starts;

    @BeforeAll
    static void start() throws Exception {
        jdbcUrl = TestDatabase.jdbcUrl();
        startApp();
        db = DriverManager.getConnection(jdbcUrl + "&ApplicationName=idem-it");
        db.createStatement().execute("INSERT INTO accounts VALUES ('rich', 1000000000) ON CONFLICT (id) DO NOTHING");
    }

    static void startApp() throws Exception {
        starts++;
        // The app's connections carry their own name, so that the test can find their sessions.
        // The duplicates' wait (then 409) is bounded well above a first call's
        // transaction on a loaded machine: with 2 s, 20 duplicates of a first
        // JPA call under Boot 4 got 409 while the first was still warming up.
        // aDuplicateWaitsBoundedThen409 waits this long.
        app = new ExampleApp(jdbcUrl + "&ApplicationName=idem-example", ExampleApp.logFile("app-" + starts),
                "--idem.wait-timeout=20s");
    }

    @AfterAll
    static void stop() throws Exception {
        if (app != null) app.close();
        if (db != null) db.close();
    }

    // ---- HTTP ---------------------------------------------------------------

    static HttpRequest.Builder post(String path, String body) {
        return HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + app.port() + path))
                .header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(body));
    }

    static HttpResponse<String> send(HttpRequest request) throws Exception {
        return HTTP.send(request, HttpResponse.BodyHandlers.ofString());
    }

    static String payment(String requestId, String account, String orderNo, long cents) {
        return String.format("{\"requestId\":\"%s\",\"accountId\":\"%s\",\"orderNo\":\"%s\",\"amountCents\":%d}",
                requestId, account, orderNo, cents);
    }

    static List<HttpResponse<String>> concurrently(int n, HttpRequest request) throws Exception {
        List<CompletableFuture<HttpResponse<String>>> futures = new ArrayList<>();
        for (int i = 0; i < n; i++) futures.add(HTTP.sendAsync(request, HttpResponse.BodyHandlers.ofString()));
        List<HttpResponse<String>> out = new ArrayList<>();
        for (CompletableFuture<HttpResponse<String>> f : futures) out.add(f.get());
        return out;
    }

    // ---- database -----------------------------------------------------------

    /** The first column of the query's one row, as text. */
    static String text(String sql, Object... args) throws Exception {
        try (PreparedStatement st = db.prepareStatement(sql)) {
            for (int i = 0; i < args.length; i++) st.setObject(i + 1, args[i]);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getString(1);
            }
        }
    }

    static long count(String sql, Object... args) throws Exception {
        return Long.parseLong(text(sql, args));
    }

    static void account(String id, long cents) throws Exception {
        try (PreparedStatement st = db.prepareStatement("INSERT INTO accounts VALUES (?, ?)"
                + " ON CONFLICT (id) DO UPDATE SET balance_cents = excluded.balance_cents")) {
            st.setString(1, id);
            st.setLong(2, cents);
            st.executeUpdate();
        }
    }

    static long balance(String id) throws Exception {
        return count("SELECT balance_cents FROM accounts WHERE id = ?", id);
    }

    /** A second connection that holds a lock on payments, so that a payment stops at its INSERT, after its claim. */
    static Connection lockPayments() throws Exception {
        Connection c = DriverManager.getConnection(jdbcUrl + "&ApplicationName=idem-it-lock");
        c.setAutoCommit(false);
        c.createStatement().execute("LOCK TABLE payments IN SHARE MODE");
        return c;
    }

    /** Waits until n of the application's sessions wait for a lock in the statement that starts so. */
    static void awaitBlocked(String queryStart, int n) throws Exception {
        while (count("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idem-example'"
                + " AND wait_event_type = 'Lock' AND query LIKE ?", queryStart + "%") < n) {
            Thread.sleep(20);
        }
    }

    /** The request's connection died with the process: no answer at all. */
    static void assertNoAnswer(CompletableFuture<HttpResponse<String>> request) throws InterruptedException {
        try {
            HttpResponse<String> r = request.get();
            throw new AssertionError("the killed process answered: " + r.statusCode() + " " + r.body());
        } catch (ExecutionException expected) {
            // an IOException from the HTTP client
        }
    }

    // ---- the tests ------------------------------------------------------------

    @Test
    @Order(1)
    void twentyConcurrentDuplicatesChargeOnce() throws Exception {
        String key = UUID.randomUUID().toString();
        long before = balance("rich");
        List<HttpResponse<String>> answers = concurrently(20, post("/payments", payment(key, "rich", "ORD-1", 4200)).build());
        Set<JsonNode> bodies = new HashSet<>();
        for (HttpResponse<String> r : answers) {
            assertEquals(200, r.statusCode(), r.body());
            bodies.add(JSON.readTree(r.body()));
        }
        assertEquals(1, bodies.size(), "20 duplicates, one answer: " + bodies);
        assertEquals(1, count("SELECT count(*) FROM payments WHERE request_id = ?", key));
        assertEquals(before - 4200, balance("rich"));
        JsonNode receipt = bodies.iterator().next();
        assertEquals(count("SELECT id FROM payments WHERE request_id = ?", key), receipt.get("paymentId").asLong());

        // A later retry: the stored receipt, read back as a Receipt, no second charge.
        HttpResponse<String> again = send(post("/payments", payment(key, "rich", "ORD-1", 4200)).build());
        assertEquals(200, again.statusCode());
        assertEquals(receipt, JSON.readTree(again.body()));
        assertEquals(1, count("SELECT count(*) FROM payments WHERE request_id = ?", key));
        assertEquals(before - 4200, balance("rich"));

        // The same key for another amount: ID001, 422, nothing charged.
        HttpResponse<String> other = send(post("/payments", payment(key, "rich", "ORD-1", 9900)).build());
        assertEquals(422, other.statusCode(), other.body());
        assertEquals("ID001", JSON.readTree(other.body()).get("sqlstate").asText());
        assertEquals(1, count("SELECT count(*) FROM payments WHERE request_id = ?", key));
        assertEquals(before - 4200, balance("rich"));
    }

    @Test
    @Order(2)
    void jpaAndJdbcTemplateInTheClaimsTransaction() throws Exception {
        String key = UUID.randomUUID().toString();
        HttpRequest place = post("/orders", "{\"sku\":\"BOOK-7\",\"quantity\":2}").header("Request-Id", key).build();
        Set<JsonNode> bodies = new HashSet<>();
        for (HttpResponse<String> r : concurrently(20, place)) {
            assertEquals(200, r.statusCode(), r.body());
            bodies.add(JSON.readTree(r.body()));
        }
        assertEquals(1, bodies.size(), "20 duplicates, one answer: " + bodies);
        assertEquals(1, count("SELECT count(*) FROM shop_orders WHERE request_id = ?", key));
        long orderId = count("SELECT id FROM shop_orders WHERE request_id = ?", key);
        assertEquals(orderId, bodies.iterator().next().get("orderId").asLong());
        assertEquals(1, count("SELECT count(*) FROM order_events WHERE order_id = ?", orderId));

        HttpResponse<String> changed = send(post("/orders", "{\"sku\":\"BOOK-7\",\"quantity\":3}").header("Request-Id", key).build());
        assertEquals(422, changed.statusCode(), changed.body());
        assertEquals("ID001", JSON.readTree(changed.body()).get("sqlstate").asText());
        assertEquals(1, count("SELECT count(*) FROM shop_orders WHERE request_id = ?", key));
    }

    @Test
    @Order(3)
    void aRollbackInTheMethodLeavesNoClaim() throws Exception {
        String key = UUID.randomUUID().toString();
        String acct = "poor-" + key;
        account(acct, 100);
        HttpResponse<String> refused = send(post("/payments", payment(key, acct, "ORD-3", 500)).build());
        assertEquals(402, refused.statusCode(), refused.body());
        assertEquals(0, count("SELECT count(*) FROM payments WHERE request_id = ?", key));
        assertEquals("absent", text("SELECT state FROM idem_lookup(?, 'payment')", key));

        account(acct, 1000);
        HttpResponse<String> retried = send(post("/payments", payment(key, acct, "ORD-3", 500)).build());
        assertEquals(200, retried.statusCode(), retried.body());
        assertEquals(1, count("SELECT count(*) FROM payments WHERE request_id = ?", key));
        assertEquals(500, balance(acct));
    }

    @Test
    @Order(4)
    void aDuplicateWaitsBoundedThen409() throws Exception {
        String key = UUID.randomUUID().toString();
        HttpRequest pay = post("/payments", payment(key, "rich", "ORD-4", 100)).build();
        CompletableFuture<HttpResponse<String>> first;
        try (Connection lock = lockPayments()) {
            first = HTTP.sendAsync(pay, HttpResponse.BodyHandlers.ofString());
            awaitBlocked("INSERT INTO payments", 1); // claimed, its transaction open
            HttpResponse<String> second = send(pay); // waits in idem_claim up to idem.wait-timeout
            assertEquals(409, second.statusCode(), second.body());
            assertEquals("55P03", JSON.readTree(second.body()).get("sqlstate").asText());
            assertTrue(second.headers().firstValue("Retry-After").isPresent());
            assertFalse(first.isDone());
            lock.rollback();
        }
        assertEquals(200, first.get().statusCode(), first.get().body());
        HttpResponse<String> third = send(pay);
        assertEquals(JSON.readTree(first.get().body()), JSON.readTree(third.body()));
        assertEquals(1, count("SELECT count(*) FROM payments WHERE request_id = ?", key));
    }

    /**
     * One SIGKILL, two requests lost in it: one held after its COMMIT (at
     * the point the application announces), one stopped in the middle of
     * its method (its INSERT waits for a lock, after its claim). Retried on
     * a new process: the first is replayed, the second runs, each charged
     * once. (One kill for both: each is a JVM start less.)
     */
    @Test
    @Order(5)
    void sigkillMidHandlerAndAfterCommitThenRetriesChargeOnce() throws Exception {
        String committed = UUID.randomUUID().toString();
        String midHandler = UUID.randomUUID().toString();
        long before = balance("rich");
        CompletableFuture<HttpResponse<String>> lostAfterCommit = HTTP.sendAsync(
                post("/payments", payment(committed, "rich", "ORD-6", 300)).header("X-Test-Hold", "after-commit")
                        .header("Request-Id", committed).build(), HttpResponse.BodyHandlers.ofString());
        app.awaitLine(Pattern.compile("HOLD after-commit " + Pattern.quote(committed)));
        assertEquals(1, count("SELECT count(*) FROM payments WHERE request_id = ?", committed)); // committed
        assertEquals("completed", text("SELECT state FROM idem_lookup(?, 'payment')", committed));
        CompletableFuture<HttpResponse<String>> lostMidHandler;
        try (Connection lock = lockPayments()) {
            lostMidHandler = HTTP.sendAsync(post("/payments", payment(midHandler, "rich", "ORD-5", 700)).build(),
                    HttpResponse.BodyHandlers.ofString());
            awaitBlocked("INSERT INTO payments", 1);
            app.kill();
            lock.rollback();
        }
        assertNoAnswer(lostAfterCommit); // the answer was lost after COMMIT
        assertNoAnswer(lostMidHandler);
        assertEquals(0, count("SELECT count(*) FROM payments WHERE request_id = ?", midHandler));
        startApp();
        HttpResponse<String> replayed = send(post("/payments", payment(committed, "rich", "ORD-6", 300)).build()); // the new port
        assertEquals(200, replayed.statusCode(), replayed.body());
        assertEquals(count("SELECT id FROM payments WHERE request_id = ?", committed), JSON.readTree(replayed.body()).get("paymentId").asLong());
        HttpResponse<String> retried = send(post("/payments", payment(midHandler, "rich", "ORD-5", 700)).build());
        assertEquals(200, retried.statusCode(), retried.body());
        assertEquals(1, count("SELECT count(*) FROM payments WHERE request_id = ?", committed));
        assertEquals(1, count("SELECT count(*) FROM payments WHERE request_id = ?", midHandler));
        assertEquals(before - 300 - 700, balance("rich"));
    }

    @Test
    @Order(6)
    void idempotencyKeyFilterRoute() throws Exception {
        long paymentId = System.nanoTime();
        String key = "\"" + UUID.randomUUID() + "\"";
        HttpRequest refund = post("/refunds", "{\"paymentId\":" + paymentId + ",\"amountCents\":300}").header("Idempotency-Key", key).build();
        Set<String> bodies = new HashSet<>();
        int firsts = 0;
        for (HttpResponse<String> r : concurrently(20, refund)) {
            assertEquals(201, r.statusCode(), r.body());
            bodies.add(r.body() + " " + r.headers().firstValue("Location").orElse(""));
            if (r.headers().firstValue("Idempotent-Replayed").isEmpty()) firsts++;
        }
        assertEquals(1, bodies.size(), "20 duplicates, one answer: " + bodies);
        assertEquals(1, firsts, "one first answer, 19 replays");
        assertEquals(1, count("SELECT count(*) FROM refunds WHERE payment_id = ?", paymentId));
        assertEquals(count("SELECT id FROM refunds WHERE payment_id = ?", paymentId),
                JSON.readTree(bodies.iterator().next().split(" ")[0]).get("refundId").asLong());

        // The same key for another amount: 422 problem, nothing written; no key: 400.
        HttpResponse<String> other = send(post("/refunds", "{\"paymentId\":" + paymentId + ",\"amountCents\":999}")
                .header("Idempotency-Key", key).build());
        assertEquals(422, other.statusCode(), other.body());
        assertEquals("application/problem+json", other.headers().firstValue("Content-Type").orElse(""));
        assertTrue(JSON.readTree(other.body()).get("type").asText().endsWith("#idempotency-key-reused"), other.body());
        HttpResponse<String> none = send(post("/refunds", "{\"paymentId\":" + paymentId + ",\"amountCents\":300}").build());
        assertEquals(400, none.statusCode(), none.body());
        assertEquals(1, count("SELECT count(*) FROM refunds WHERE payment_id = ?", paymentId));
    }
}
