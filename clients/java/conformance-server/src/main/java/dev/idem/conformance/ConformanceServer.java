package dev.idem.conformance;

import dev.idem.spring.IdemClaim;
import dev.idem.spring.web.DefaultStore;
import dev.idem.spring.web.IdemLease;
import dev.idem.spring.web.IdemTenant;
import dev.idem.spring.web.IdempotentRequest;
import dev.idem.spring.web.Json;
import jakarta.servlet.http.HttpServletRequest;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.function.IntPredicate;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.annotation.Bean;
import org.springframework.http.MediaType;
import org.springframework.http.ResponseEntity;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.transaction.support.TransactionTemplate;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RestController;

/**
 * The server a conformance runner needs (tests/middleware/README.md): six
 * routes with the filter's rules, the handler on the filter's transaction;
 * and bench/middleware.sh java's routes (/bench/a, c, d).
 */
@SpringBootApplication
@RestController
public class ConformanceServer {
    public static void main(String[] args) {
        SpringApplication.run(ConformanceServer.class, args);
    }

    /** The test's tenant hook: the X-Tenant header (a real one would read the authenticated principal). */
    @Bean
    IdemTenant tenant() {
        return request -> request.getHeader("X-Tenant");
    }

    /** Stores 2xx only. */
    public static class Only2xx implements IntPredicate {
        @Override
        public boolean test(int status) {
            return status >= 200 && status < 300 && new DefaultStore().test(status);
        }
    }

    private final JdbcTemplate jdbc;
    private final TransactionTemplate transactions;

    public ConformanceServer(JdbcTemplate jdbc, TransactionTemplate transactions) {
        this.jdbc = jdbc;
        this.transactions = transactions;
    }

    @PostMapping("/conformance/orders")
    @IdempotentRequest(bizType = "conformance.orders")
    public ResponseEntity<String> orders(@RequestBody(required = false) byte[] body, HttpServletRequest request) {
        return handle(body, request);
    }

    @PostMapping("/conformance/orders-nowait")
    @IdempotentRequest(bizType = "conformance.nowait", waitForFirst = false)
    public ResponseEntity<String> nowait(@RequestBody(required = false) byte[] body, HttpServletRequest request) {
        return handle(body, request);
    }

    @PostMapping("/conformance/orders-short-wait")
    @IdempotentRequest(bizType = "conformance.shortwait", lockTimeout = "200ms")
    public ResponseEntity<String> shortWait(@RequestBody(required = false) byte[] body, HttpServletRequest request) {
        return handle(body, request);
    }

    @PostMapping("/conformance/orders-anonymous")
    @IdempotentRequest(bizType = "conformance.anonymous", anonymous = true)
    public ResponseEntity<String> anonymous(@RequestBody(required = false) byte[] body, HttpServletRequest request) {
        return handle(body, request);
    }

    /** Its business type is configured by the runner with on_failure => 'retry'. */
    @PostMapping("/conformance/orders-retry")
    @IdempotentRequest(bizType = "conformance.retry")
    public ResponseEntity<String> retry(@RequestBody(required = false) byte[] body, HttpServletRequest request) {
        return handle(body, request);
    }

    @PostMapping("/conformance/orders-2xx-only")
    @IdempotentRequest(bizType = "conformance.only2xx", store = Only2xx.class)
    public ResponseEntity<String> only2xx(@RequestBody(required = false) byte[] body, HttpServletRequest request) {
        return handle(body, request);
    }

    /** Lease mode, a 60 s lease (Retry-After stays 1): the handler runs in the filter's second transaction. */
    @PostMapping("/conformance/orders-lease")
    @IdempotentRequest(bizType = "conformance.lease", lease = "60 seconds")
    public ResponseEntity<String> lease(@RequestBody(required = false) byte[] body, HttpServletRequest request) {
        return handle(body, request);
    }

    /**
     * Lease mode beyond the table (ConformanceTest.leaseTakeover): a 1 s
     * lease; X-Checkpoint: P records P with {"n":1}; the answer tells the
     * attempt and the recovery point and data the handler was given.
     */
    @PostMapping("/java/lease-takeover")
    @IdempotentRequest(bizType = "java.lease", lease = "1 second")
    public ResponseEntity<String> leaseTakeover(@RequestBody byte[] body, HttpServletRequest request) {
        IdemLease lease = IdemLease.of(request);
        String given = "{\"attempt\":" + lease.attempt() + ",\"point\":" + (lease.recoveryPoint() == null ? "null"
                : "\"" + lease.recoveryPoint() + "\"") + ",\"data\":" + lease.recoveryData() + "}";
        String point = request.getHeader("X-Checkpoint");
        if (point != null) lease.checkpoint(point, "{\"n\":1}");
        ResponseEntity<String> answer = handle(body, request);
        return ResponseEntity.status(answer.getStatusCode()).headers(answer.getHeaders())
                .body(answer.getBody().replaceFirst("\\}$", ",\"given\":" + given + "}"));
    }

    // ---- bench/middleware.sh java: one handler, three ways -------------------------

    /** a and b: the filter (a new key per request; replays of those keys). */
    @PostMapping("/bench/a")
    @IdempotentRequest(bizType = "bench.create")
    public ResponseEntity<String> benchFilter(@RequestBody byte[] body) {
        long amount = amount(body);
        return benchCreated(jdbc.queryForObject("INSERT INTO bench_orders (amount) VALUES (?) RETURNING id", Long.class, amount), amount);
    }

    /**
     * c: idempotency without idem, as a team writes it with Spring MVC and
     * JdbcTemplate: a dedup row claimed with INSERT ... ON CONFLICT (a
     * duplicate waits for the first's commit, then reads its response), the
     * business insert, the response stored, one transaction.
     */
    @PostMapping("/bench/c")
    public ResponseEntity<String> benchHandWritten(@RequestBody byte[] body, HttpServletRequest request) {
        String key = request.getHeader("Idempotency-Key");
        return transactions.execute(status -> {
            if (jdbc.queryForList("INSERT INTO bench_dedup (key) VALUES (?) ON CONFLICT DO NOTHING RETURNING key", String.class, key).isEmpty()) {
                String stored = jdbc.queryForObject("SELECT response::text FROM bench_dedup WHERE key = ?", String.class, key);
                return ResponseEntity.status(201).contentType(MediaType.APPLICATION_JSON).header("Idempotent-Replayed", "true").body(stored);
            }
            long amount = amount(body);
            Long id = jdbc.queryForObject("INSERT INTO bench_orders (amount) VALUES (?) RETURNING id", Long.class, amount);
            ResponseEntity<String> created = benchCreated(id, amount);
            jdbc.update("UPDATE bench_dedup SET response = ?::jsonb WHERE key = ?", created.getBody(), key);
            return created;
        });
    }

    /** d: no idempotency, the business insert in a transaction (the floor). */
    @PostMapping("/bench/d")
    public ResponseEntity<String> benchNone(@RequestBody byte[] body) {
        long amount = amount(body);
        return transactions.execute(status -> benchCreated(
                jdbc.queryForObject("INSERT INTO bench_orders (amount) VALUES (?) RETURNING id", Long.class, amount), amount));
    }

    private static long amount(byte[] body) {
        return (long) ((Json.Num) ((Map<?, ?>) Json.parse(new String(body, StandardCharsets.UTF_8))).get("amount")).value();
    }

    private static ResponseEntity<String> benchCreated(long id, long amount) {
        return ResponseEntity.status(201).contentType(MediaType.APPLICATION_JSON).body("{\"id\":" + id + ",\"amount\":" + amount + "}");
    }

    private static MediaType contentType(HttpServletRequest request) {
        try {
            return request.getContentType() == null ? MediaType.APPLICATION_JSON : MediaType.parseMediaType(request.getContentType());
        } catch (org.springframework.util.InvalidMimeTypeException e) {
            return MediaType.APPLICATION_JSON;
        }
    }

    private ResponseEntity<String> handle(byte[] body, HttpServletRequest request) {
        String hold = request.getHeader("X-Conformance-Hold");
        if (hold != null) {
            jdbc.queryForObject("SELECT pg_advisory_xact_lock(hashtext(?))::text", String.class, hold);
        }
        String text = body == null ? "" : new String(body, StandardCharsets.UTF_8);
        String run;
        if (MediaType.APPLICATION_FORM_URLENCODED.includes(contentType(request))) {
            run = request.getParameter("run");  // the container's form field, which the filter's request gives
        } else {
            run = String.valueOf(((Map<?, ?>) Json.parse(text.isEmpty() ? "{}" : text)).get("run"));
        }
        String statusHeader = request.getHeader("X-Conformance-Status");
        int status = statusHeader == null ? 201 : Integer.parseInt(statusHeader);
        Long id = jdbc.queryForObject("INSERT INTO conformance_rows (run, tenant, status) VALUES (?, ?, ?) RETURNING id",
                Long.class, run, request.getHeader("X-Tenant"), status);
        String fail = request.getHeader("X-Conformance-Fail");
        if (fail != null) {
            jdbc.queryForObject("SELECT raise_sqlstate(?)::text", String.class, fail);
        }
        ResponseEntity.BodyBuilder answer = ResponseEntity.status(status).contentType(MediaType.APPLICATION_JSON)
                .header("Location", "/conformance/rows/" + id).header("X-Conformance-Row", Long.toString(id));
        IdemClaim claim = IdemClaim.current();
        if (claim != null) {
            answer.header("X-Conformance-Attempt", Integer.toString(claim.attempt()));
            if (claim.previousError() != null && Json.parse(claim.previousError()) instanceof Map<?, ?> error
                    && error.get("status") instanceof Json.Num previous) {
                answer.header("X-Conformance-Previous-Status", Long.toString((long) previous.value()));
            }
        }
        return answer.body("{\"id\":" + id + pad(request.getHeader("X-Conformance-Pad")) + "}");
    }

    /** With X-Conformance-Pad: N, a member "pad" of N letters x. */
    static String pad(String n) {
        return n == null ? "" : ",\"pad\":\"" + "x".repeat(Integer.parseInt(n)) + "\"";
    }
}
