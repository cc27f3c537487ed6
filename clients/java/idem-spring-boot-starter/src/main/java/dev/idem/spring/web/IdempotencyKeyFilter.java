package dev.idem.spring.web;

import dev.idem.spring.ClaimStatement;
import dev.idem.spring.IdemClaim;
import dev.idem.spring.IdemProperties;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ReadListener;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletInputStream;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;
import jakarta.servlet.http.HttpServletResponse;
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.IntPredicate;
import java.util.regex.Pattern;
import javax.sql.DataSource;
import org.apache.commons.logging.Log;
import org.apache.commons.logging.LogFactory;
import org.springframework.core.annotation.AnnotatedElementUtils;
import org.springframework.jdbc.datasource.ConnectionHolder;
import org.springframework.jdbc.datasource.DataSourceUtils;
import org.springframework.transaction.PlatformTransactionManager;
import org.springframework.transaction.TransactionDefinition;
import org.springframework.transaction.TransactionStatus;
import org.springframework.transaction.support.TransactionSynchronizationManager;
import org.springframework.web.filter.OncePerRequestFilter;
import org.springframework.web.method.HandlerMethod;
import org.springframework.web.servlet.HandlerExecutionChain;
import org.springframework.web.servlet.mvc.method.RequestMappingInfo;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerMapping;
import org.springframework.web.util.ContentCachingResponseWrapper;
import org.springframework.web.util.ServletRequestPathUtils;

/**
 * The Idempotency-Key middleware of Spring MVC: for a request to a handler
 * method marked {@link IdempotentRequest}, the rules of docs/http.md (the
 * same as the Python, Node and Go clients', checked by the shared
 * conformance table). The request's transaction is opened here, on the
 * application's transaction manager; the claim is its first statement, the
 * handler runs in it (its JdbcTemplate, JPA and {@code @Transactional}
 * code join it), and the response is stored in it before COMMIT and sent
 * after: the claim, the business writes and the stored response commit
 * together or not at all.
 */
public class IdempotencyKeyFilter extends OncePerRequestFilter implements org.springframework.core.Ordered {
    /** Marks a replayed response (a common convention, not part of the IETF draft). */
    public static final String REPLAYED_HEADER = "Idempotent-Replayed";
    /** On a replay: until when the key's stored response is kept (an HTTP-date); a retry after it runs the operation again. */
    public static final String EXPIRES_HEADER = "Idempotent-Expires";
    private static final java.time.format.DateTimeFormatter HTTP_DATE =
            java.time.format.DateTimeFormatter.ofPattern("EEE, dd MMM yyyy HH:mm:ss 'GMT'", java.util.Locale.US).withZone(java.time.ZoneOffset.UTC);

    /** The problem types (docs/http.md, "Problem types"): slug, status, title. Never stored. */
    public static final Map<String, Object[]> PROBLEMS = new LinkedHashMap<>();
    static {
        PROBLEMS.put("idempotency-key-missing", new Object[] {400, "Idempotency-Key missing"});
        PROBLEMS.put("idempotency-key-invalid", new Object[] {400, "Idempotency-Key invalid"});
        PROBLEMS.put("idempotency-key-reused", new Object[] {422, "Idempotency-Key reused for a different request"});
        PROBLEMS.put("request-in-progress", new Object[] {409, "Request in progress"});
        PROBLEMS.put("response-not-replayable", new Object[] {422, "Stored response not replayable"});
        PROBLEMS.put("transient-failure", new Object[] {503, "Transient failure"});
        PROBLEMS.put("tenant-missing", new Object[] {500, "No tenant for this request"});
        PROBLEMS.put("internal-error", new Object[] {500, "Response not stored"});
    }

    private static final Log LOG = LogFactory.getLog(IdempotencyKeyFilter.class);
    private static final Pattern BIZ_TYPE = Pattern.compile("^[A-Za-z0-9_.:-]{1,64}$");
    private static final Set<String> TRANSIENT = Set.of("40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "53300");

    /** lease: a PostgreSQL interval, or null (no lease mode); retryAfter: seconds, on this route's 409 and 503. */
    private record Route(String bizType, boolean keyOptional, boolean waitForFirst, Duration lockTimeout, String ttl, boolean anonymous,
                         List<String> excludeFields, IntPredicate store, String lease, int retryAfter) { }

    private final IdemProperties.Http cfg;
    private final String schemaPrefix;
    private DataSource dataSource;
    private PlatformTransactionManager transactions;
    private IdemTenant tenant;
    private RequestMappingHandlerMapping mapping;
    private final Map<java.lang.reflect.Method, Route> routes = new java.util.HashMap<>();
    /** HTTP methods of the marked mappings (null: any); other requests pass without a handler lookup. */
    private Set<String> methods = new HashSet<>();

    public IdempotencyKeyFilter(IdemProperties properties) {
        this.cfg = properties.getHttp();
        String schema = properties.getSchema();
        this.schemaPrefix = schema == null || schema.isEmpty() ? "" : "\"" + schema.replace("\"", "\"\"") + "\".";
        if (cfg.getMinKeyLength() < 1 || cfg.getMinKeyLength() > cfg.getMaxKeyLength() || cfg.getMaxKeyLength() > 255) {
            throw new IllegalStateException("idem.http: need 1 <= min-key-length <= max-key-length <= 255");
        }
    }

    /**
     * Reads the marked handler methods, once every bean exists (the web server
     * takes requests only after this). Checks the configuration as the other
     * clients do at start-up: a key scope must be chosen (a tenant hook, or
     * single-tenant), business types must be valid.
     */
    public void init(DataSource dataSource, PlatformTransactionManager transactions, IdemTenant tenant,
                     RequestMappingHandlerMapping mapping) {
        this.dataSource = dataSource;
        this.transactions = transactions;
        this.tenant = tenant;
        this.mapping = mapping;
        for (Map.Entry<RequestMappingInfo, HandlerMethod> e : mapping.getHandlerMethods().entrySet()) {
            IdempotentRequest a = AnnotatedElementUtils.findMergedAnnotation(e.getValue().getMethod(), IdempotentRequest.class);
            if (a == null) continue;
            String where = e.getValue().getShortLogMessage();
            if (!BIZ_TYPE.matcher(a.bizType()).matches()) {
                throw new IllegalStateException("@IdempotentRequest on " + where + ": business type \"" + a.bizType() + "\" does not match " + BIZ_TYPE);
            }
            if (tenant == null && !cfg.isSingleTenant()) {
                throw new IllegalStateException("@IdempotentRequest on " + where + ": choose the key scope: a bean of type IdemTenant"
                        + " (the authenticated caller's tenant; keys of different tenants never meet), or idem.http.single-tenant=true"
                        + " (every caller shares one key space). Without either, one caller could be replayed another's response");
            }
            if (tenant != null && cfg.isSingleTenant()) {
                throw new IllegalStateException("idem.http.single-tenant=true and an IdemTenant bean exclude each other");
            }
            if ((a.anonymous() || cfg.isAnonymous()) && tenant == null) {
                throw new IllegalStateException("@IdempotentRequest on " + where + ": anonymous needs an IdemTenant bean");
            }
            IntPredicate store;
            try {
                store = a.store().getDeclaredConstructor().newInstance();
            } catch (ReflectiveOperationException x) {
                throw new IllegalStateException("@IdempotentRequest on " + where + ": cannot make its store rule " + a.store(), x);
            }
            List<String> exclude = new ArrayList<>(cfg.getExcludeFields());
            exclude.addAll(List.of(a.excludeFields()));
            routes.put(e.getValue().getMethod(), new Route(a.bizType(), a.keyOptional(), a.waitForFirst(),
                    a.lockTimeout().isEmpty() ? cfg.getLockTimeout() : duration(a.lockTimeout(), where),
                    a.ttl().isEmpty() ? null : a.ttl(), a.anonymous() || cfg.isAnonymous(), exclude, store,
                    a.lease().isEmpty() ? null : a.lease(), a.retryAfter() > 0 ? a.retryAfter() : cfg.getRetryAfter()));
            Set<org.springframework.web.bind.annotation.RequestMethod> ms = e.getKey().getMethodsCondition().getMethods();
            if (ms.isEmpty()) {
                methods = null;
            } else if (methods != null) {
                ms.forEach(m -> methods.add(m.name()));
            }
        }
        LOG.info("Idempotency-Key filter: " + routes.size() + " @IdempotentRequest handler method(s)");
    }

    private static Duration duration(String text, String where) {
        java.util.regex.Matcher m = Pattern.compile("(-?\\d+)\\s*(ms|s|m)").matcher(text.trim());
        if (!m.matches()) throw new IllegalStateException("@IdempotentRequest on " + where + ": lockTimeout \"" + text + "\" is not like 200ms, 5s or 1m");
        long n = Long.parseLong(m.group(1));
        return switch (m.group(2)) {
            case "ms" -> Duration.ofMillis(n);
            case "s" -> Duration.ofSeconds(n);
            default -> Duration.ofMinutes(n);
        };
    }

    /** Last among the filters: authentication (Spring Security) has run when the tenant hook asks who the caller is. */
    @Override
    public int getOrder() {
        return LOWEST_PRECEDENCE - 10;
    }

    @Override
    protected void doFilterInternal(HttpServletRequest request, HttpServletResponse response, FilterChain chain)
            throws ServletException, IOException {
        Route rt = routes.isEmpty() || (methods != null && !methods.contains(request.getMethod())) ? null : route(request);
        if (rt == null) {
            chain.doFilter(request, response);
            return;
        }
        List<String> fields = Collections.list(request.getHeaders(cfg.getHeader()));
        if (fields.isEmpty()) {
            if (rt.keyOptional) {
                runUnclaimed(rt, request, response, chain);
                return;
            }
            problem(response, "idempotency-key-missing", "Send " + cfg.getHeader() + ": \"<key>\", " + cfg.getMinKeyLength() + " to "
                    + cfg.getMaxKeyLength() + " visible ASCII characters, made once per intent.", 0);
            return;
        }
        // Field lines are combined with commas, as HTTP does: two lines are two values.
        KeyField.Parsed parsed = KeyField.parse(String.join(", ", fields), cfg.getMinKeyLength(), cfg.getMaxKeyLength(), cfg.isBareKeys());
        if (parsed.key() == null) {
            problem(response, "idempotency-key-invalid", cfg.getHeader() + ": " + parsed.why() + ".", 0);
            return;
        }
        String scope = KeyField.SHARED_SCOPE;
        if (tenant != null) {
            String t = tenant.tenant(request);
            if (t != null && !t.isEmpty()) {
                scope = KeyField.tenantScope(t);
            } else if (!rt.anonymous) {
                LOG.error("idem: the tenant hook returned no tenant for " + request.getMethod() + " " + request.getRequestURI() + " (route "
                        + rt.bizType + "); answered 500. Authenticate before this filter, or allow anonymous callers (anonymous).");
                problem(response, "tenant-missing", "The server found no tenant for this request; nothing was done.", 0);
                return;
            }
        }
        String scoped = KeyField.scopedKey(scope, parsed.key());
        if (scoped.getBytes(StandardCharsets.UTF_8).length > 1024) { // idem refuses longer keys with 22023
            problem(response, "idempotency-key-invalid", cfg.getHeader() + ": the key with its tenant is over 1024 bytes.", 0);
            return;
        }
        byte[] body = request.getInputStream().readAllBytes();
        BodyRequest req = new BodyRequest(request, body);
        String fingerprint = Fingerprint.of(request.getMethod(), request.getRequestURI(), request.getQueryString(), scope, body, rt.excludeFields);

        TransactionStatus tx;
        try {
            tx = transactions.getTransaction(TransactionDefinition.withDefaults());
        } catch (RuntimeException e) {
            internal(request, response, rt, e);
            return;
        }
        try { // (every path below ends the transaction; the finally clause is for an exception)
            String[] claim;
            try {
                claim = claim(rt, scoped, fingerprint);
            } catch (SQLException e) {
                String state = e.getSQLState();
                rollback(tx);
                if ("55P03".equals(state) || "57014".equals(state)) {
                    inProgress(response, rt); // the bounded wait for the first request ran out: still in progress
                } else if ("ID001".equals(state)) {
                    problem(response, "idempotency-key-reused", "This Idempotency-Key was first used for a different request; "
                            + "do not retry this request, a new request needs a new key.", 0);
                } else {
                    internal(request, response, rt, e);
                }
                return;
            }
            if (!"t".equals(claim[0])) {
                rollback(tx);
                replay(response, rt, claim[1], claim[2], claim[3]);
                return;
            }
            IdemClaim told = IdemClaim.told(scoped, rt.bizType, claim[2]);
            IdemLease lease = null;
            if (rt.lease != null) {
                // Lease mode: the claim commits now, so that it outlives this
                // process and a takeover finds the recovery points; the
                // handler's writes and the stored response are a second
                // transaction. An answer not stored from here on hands the lease
                // back (abandon); a lost process leaves it to run out.
                lease = lease(scoped, rt.bizType, claim[2]);
                try {
                    transactions.commit(tx);
                    tx = transactions.getTransaction(TransactionDefinition.withDefaults());
                } catch (RuntimeException e) {
                    internal(request, response, rt, e);
                    return;
                }
                req.setAttribute(IdemLease.ATTRIBUTE, lease);
            }
            runAndStore(rt, req, response, chain, tx, scoped, told, lease);
        } finally {
            rollback(tx); // a no-op once committed or rolled back
        }
    }

    /** An optional key, absent: the handler runs in a transaction all the same, committed if its answer would be stored. */
    private void runUnclaimed(Route rt, HttpServletRequest request, HttpServletResponse response, FilterChain chain)
            throws ServletException, IOException {
        TransactionStatus tx = transactions.getTransaction(TransactionDefinition.withDefaults());
        try {
            runAndStore(rt, request, response, chain, tx, null, null, null);
        } finally {
            rollback(tx);
        }
    }

    /**
     * Runs the handler in tx with its answer held back; if the answer is to
     * be stored, stores it for the claim of scoped (null: no claim, an
     * optional key's absence) and commits, then sends it; if not, rolls back
     * (claim included; a lease is handed back) and sends it. told: the
     * claim as the handler sees it (IdemClaim.current()), null without one.
     */
    private void runAndStore(Route rt, HttpServletRequest req, HttpServletResponse response, FilterChain chain, TransactionStatus tx,
                             String scoped, IdemClaim told, IdemLease lease) throws ServletException, IOException {
        ContentCachingResponseWrapper rec = new ContentCachingResponseWrapper(response);
        if (told != null) req.setAttribute(IdemClaim.ATTRIBUTE, told);
        try (IdemClaim.Scope bound = told == null ? null : told.bind()) {
            chain.doFilter(req, rec);
        } catch (ServletException | IOException | RuntimeException e) {
            abandon(tx, lease);
            SQLException sql = sqlCause(e);
            if (sql != null && transientFailure(sql)) {
                rec.reset();
                unavailable(response, rt, sql);
                return;
            }
            throw e;
        }
        int status = rec.getStatus();
        if (tx.isRollbackOnly() || !rt.store.test(status)) {
            // Not stored (or the handler's own @Transactional code marked the
            // transaction rollback-only): rolled back, claim included; the retry runs.
            abandon(tx, lease);
            rec.copyBodyToResponse();
            return;
        }
        if (scoped != null) {
            String doc = StoredResponse.document(status, storedHeaders(rec), rec.getContentAsByteArray(), cfg.getMaxStoredBody());
            try {
                finish(status < 400 ? "idem_complete" : "idem_fail", scoped, rt.bizType, new String[] {doc}, lease == null ? null : lease.token(),
                        commitsWithStore(tx));
            } catch (SQLException e) {
                abandon(tx, lease);
                rec.reset();
                notStored(req, response, rt, e);
                return;
            }
        }
        try {
            transactions.commit(tx); // (after a COMMIT sent with the stored response, pgJDBC sends nothing)
        } catch (RuntimeException e) {
            // (the outcome may be unknown: a retry replays it or runs again)
            rec.reset();
            if (scoped != null) {
                notStored(req, response, rt, e);
            } else {
                internal(req, response, rt, e);
            }
            return;
        }
        rec.copyBodyToResponse();
    }

    private Route route(HttpServletRequest request) {
        // The handler Spring MVC will pick; the lookup needs the parsed path, as
        // DispatcherServlet sets it. Attributes the lookup sets are removed again.
        Set<String> before = new HashSet<>(Collections.list(request.getAttributeNames()));
        boolean parsedHere = !ServletRequestPathUtils.hasParsedRequestPath(request);
        try {
            if (parsedHere) ServletRequestPathUtils.parseAndCache(request);
            HandlerExecutionChain chain = mapping.getHandler(request);
            if (chain != null && chain.getHandler() instanceof HandlerMethod hm) return routes.get(hm.getMethod());
            return null;
        } catch (Exception e) {
            return null; // no handler (405, 406...): Spring MVC answers it
        } finally {
            for (String name : Collections.list(request.getAttributeNames())) {
                if (!before.contains(name)) request.removeAttribute(name);
            }
        }
    }

    /** idem_claim on the transaction's connection: {claimed ("t"/"f"), state, result, expires_at as an HTTP-date}. */
    private String[] claim(Route rt, String scoped, String fingerprint) throws SQLException {
        Connection con = connection();
        try (PreparedStatement st = ClaimStatement.prepare(con, schemaPrefix, scoped, rt.bizType, rt.ttl, fingerprint, rt.waitForFirst,
                rt.lockTimeout, rt.lease)) {
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                boolean claimed = rs.getBoolean(1);
                // expires_at is read and formatted for a replay only (its Idempotent-Expires header)
                java.sql.Timestamp expires = claimed ? null : rs.getTimestamp(4);
                return new String[] {claimed ? "t" : "f", rs.getString(2), rs.getString(3),
                        expires == null ? null : HTTP_DATE.format(expires.toInstant())};
            }
        } finally {
            DataSourceUtils.releaseConnection(con, dataSource);
        }
    }

    /**
     * The stored response may travel with COMMIT (one round trip instead of
     * two): when COMMIT has nothing else to do, that is the transaction is
     * the filter's own on a DataSourceTransactionManager (JPA would flush
     * at commit) with no synchronization registered (whose beforeCommit
     * would run after the COMMIT: an @Idempotent method's guard, a
     * transactional event listener), and the driver is pgJDBC, whose
     * commit() then sends nothing, as its transaction is no longer open.
     */
    private boolean commitsWithStore(TransactionStatus tx) {
        if (!(transactions instanceof org.springframework.jdbc.datasource.DataSourceTransactionManager) || !tx.isNewTransaction()
                || tx.isRollbackOnly()
                || (TransactionSynchronizationManager.isSynchronizationActive() && !TransactionSynchronizationManager.getSynchronizations().isEmpty())) {
            return false;
        }
        Boolean known = pgJdbc;
        if (known == null) {
            Connection con = connection();
            try {
                known = pgJdbc = "PostgreSQL JDBC Driver".equals(con.getMetaData().getDriverName());
            } catch (SQLException e) {
                return false;
            } finally {
                DataSourceUtils.releaseConnection(con, dataSource);
            }
        }
        return known;
    }

    /** Whether the DataSource's driver is pgJDBC (commitsWithStore), once known. */
    private volatile Boolean pgJdbc;

    /**
     * idem_complete or idem_fail (args: the jsonb document), idem_checkpoint
     * (point, data) or idem_release (no argument), on the transaction's
     * connection; andCommit: COMMIT in the same round trip (not run if the
     * function fails).
     */
    private void finish(String function, String scoped, String bizType, String[] args, String token, boolean andCommit) throws SQLException {
        Connection con = connection();
        String sql = "SELECT " + schemaPrefix + function + "(?, ?, " + switch (args.length) {
            case 0 -> "";
            case 1 -> "?::jsonb, ";
            default -> "?, ?::jsonb, ";
        } + "?)" + (andCommit ? "; COMMIT" : "");
        try (PreparedStatement st = con.prepareStatement(sql)) {
            int i = 1;
            st.setString(i++, scoped);
            st.setString(i++, bizType);
            for (String a : args) st.setString(i++, a);
            st.setString(i, token);
            st.execute();
        } finally {
            DataSourceUtils.releaseConnection(con, dataSource);
        }
    }

    /** The lease document idem_claim returned to the lease holder: {attempt, recovery_point, recovery_data, lease_until, lease_token}. */
    private IdemLease lease(String scoped, String bizType, String result) {
        Map<?, ?> doc = (Map<?, ?>) Json.parse(result);
        Object attempt = doc.get("attempt");
        Object point = doc.get("recovery_point");
        Object data = doc.get("recovery_data");
        return new IdemLease(scoped, bizType, (String) doc.get("lease_token"),
                attempt instanceof Json.Num n ? Math.max((int) n.value(), 1) : 1,
                point instanceof String p ? p : null, data == null || data == Json.NULL ? null : Json.canonical(data), this::checkpoint);
    }

    /** IdemLease.checkpoint: in a transaction of its own (the request's is suspended meanwhile), committed at once. */
    private void checkpoint(IdemLease lease, String point, String dataJson) {
        TransactionStatus own = transactions.getTransaction(new org.springframework.transaction.support.DefaultTransactionDefinition(
                TransactionDefinition.PROPAGATION_REQUIRES_NEW));
        try {
            finish("idem_checkpoint", lease.key(), lease.bizType(), new String[] {point, dataJson}, lease.token(), false);
            transactions.commit(own);
        } catch (SQLException e) {
            throw new org.springframework.dao.DataAccessResourceFailureException("idem_checkpoint: " + e.getMessage(), e);
        } finally {
            rollback(own);
        }
    }

    private Connection connection() {
        if (!(TransactionSynchronizationManager.getResource(dataSource) instanceof ConnectionHolder)) {
            throw new IllegalStateException("idem: the transaction manager " + transactions.getClass().getName() + " holds no connection"
                    + " of the application's DataSource: the claim would not be part of the request's transaction");
        }
        return DataSourceUtils.getConnection(dataSource);
    }

    /**
     * An answer that is not stored: tx rolled back, and a lease handed back
     * (idem_release, in a transaction of its own) before the answer goes
     * out, so that the client's retry takes it over at once instead of
     * getting 409 until the lease runs out. Best effort: if the release
     * fails, the lease runs out.
     */
    private void abandon(TransactionStatus tx, IdemLease lease) {
        rollback(tx);
        if (lease == null) return;
        try {
            TransactionStatus own = transactions.getTransaction(TransactionDefinition.withDefaults());
            try {
                finish("idem_release", lease.key(), lease.bizType(), new String[0], lease.token(), false);
                transactions.commit(own);
            } finally {
                rollback(own);
            }
        } catch (SQLException | RuntimeException e) {
            LOG.warn("idem: handing back the lease of (" + lease.bizType() + ", " + lease.key() + "): " + e);
        }
    }

    private void rollback(TransactionStatus tx) {
        if (tx.isCompleted()) return;
        try {
            transactions.rollback(tx);
        } catch (RuntimeException e) {
            LOG.warn("idem: rollback of the request's transaction failed: " + e);
        }
    }

    private List<String[]> storedHeaders(ContentCachingResponseWrapper rec) {
        List<String[]> out = new ArrayList<>();
        for (String name : cfg.getStoredHeaders()) {
            if (name.equalsIgnoreCase("Content-Type")) {
                // the servlet container keeps it apart from the other headers
                if (rec.getContentType() != null) out.add(new String[] {"Content-Type", rec.getContentType()});
                continue;
            }
            for (String v : rec.getHeaders(name)) out.add(new String[] {name, v});
        }
        return out;
    }

    private void replay(HttpServletResponse response, Route rt, String state, String result, String expires) throws IOException {
        if ("in_progress".equals(state)) {
            inProgress(response, rt);
            return;
        }
        StoredResponse stored = StoredResponse.read(result);
        if (stored == null) {
            // Finished by other code without a response (docs/http.md, "Finished
            // by other code"): completed, 204 (done; other code's result is not
            // the client's to see); failed, 422.
            if ("completed".equals(state)) {
                markReplay(response, expires);
                response.setStatus(HttpServletResponse.SC_NO_CONTENT);
                return;
            }
            problem(response, "response-not-replayable", "The request with this Idempotency-Key failed, and no response was stored"
                    + " for it; a new request needs a new key.", 0);
            return;
        }
        response.setStatus(stored.status());
        for (String[] h : stored.headers()) {
            if (h[0].equalsIgnoreCase("Content-Type")) {
                response.setContentType(h[1]);
            } else {
                response.addHeader(h[0], h[1]);
            }
        }
        markReplay(response, expires);
        response.setContentLength(stored.body().length);
        response.getOutputStream().write(stored.body());
    }

    private static void markReplay(HttpServletResponse response, String expires) {
        response.setHeader(REPLAYED_HEADER, "true");
        if (expires != null) response.setHeader(EXPIRES_HEADER, expires);
    }

    /** retryAfter: seconds, 0 for none. */
    private void problem(HttpServletResponse response, String slug, String detail, int retryAfter) throws IOException {
        Object[] p = PROBLEMS.get(slug);
        StringBuilder b = new StringBuilder("{\"type\":");
        Json.string(b, cfg.getProblemBase() + slug);
        b.append(",\"title\":");
        Json.string(b, (String) p[1]);
        b.append(",\"status\":").append(p[0]).append(",\"detail\":");
        Json.string(b, detail);
        byte[] bytes = b.append('}').toString().getBytes(StandardCharsets.UTF_8);
        response.setStatus((Integer) p[0]);
        response.setContentType("application/problem+json");
        if (retryAfter > 0) response.setHeader("Retry-After", Integer.toString(retryAfter));
        response.setContentLength(bytes.length);
        response.getOutputStream().write(bytes);
    }

    private void inProgress(HttpServletResponse response, Route rt) throws IOException {
        problem(response, "request-in-progress", "A request with this Idempotency-Key is being processed (or holds a lease); retry later"
                + " with the same key.", rt.retryAfter);
    }

    private void unavailable(HttpServletResponse response, Route rt, SQLException e) throws IOException {
        String code = e.getSQLState() == null ? "connection lost" : e.getSQLState();
        problem(response, "transient-failure", "A transient database failure (" + code + "); nothing was done, retry with the same "
                + cfg.getHeader() + ".", rt.retryAfter);
    }

    /** An error that is neither the caller's nor transient: logged, a plain 500. */
    private void internal(HttpServletRequest request, HttpServletResponse response, Route rt, Exception e) throws IOException {
        SQLException sql = sqlCause(e);
        if (sql != null && transientFailure(sql)) {
            unavailable(response, rt, sql);
            return;
        }
        LOG.error("idem: " + request.getMethod() + " " + request.getRequestURI() + " (" + rt.bizType + "): " + e, e);
        response.setStatus(HttpServletResponse.SC_INTERNAL_SERVER_ERROR);
        response.setContentType("text/plain");
        response.getOutputStream().write("internal server error\n".getBytes(StandardCharsets.US_ASCII));
    }

    /** A failure to store the response or to commit. */
    private void notStored(HttpServletRequest request, HttpServletResponse response, Route rt, Exception e) throws IOException {
        SQLException sql = sqlCause(e);
        if (sql != null && transientFailure(sql)) {
            unavailable(response, rt, sql);
            return;
        }
        LOG.error("idem: " + request.getMethod() + " " + request.getRequestURI() + " (" + rt.bizType + "): storing the response: " + e, e);
        problem(response, "internal-error", "The response could not be stored; nothing was committed, or the outcome is unknown.", 0);
    }

    static SQLException sqlCause(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t instanceof SQLException s) return s;
            if (t.getCause() == t) break;
        }
        return null;
    }

    /** Serialization failure, deadlock, lock or statement timeout, a server going away, a lost connection: retry. */
    static boolean transientFailure(SQLException e) {
        String code = e.getSQLState();
        return code == null ? e instanceof java.sql.SQLRecoverableException || e instanceof java.sql.SQLTransientException
                : TRANSIENT.contains(code) || code.startsWith("08");
    }

    /** The request with its body read once (for the fingerprint) and given to the handler again. */
    private static final class BodyRequest extends HttpServletRequestWrapper {
        private final byte[] body;

        BodyRequest(HttpServletRequest request, byte[] body) {
            super(request);
            this.body = body;
        }

        @Override
        public ServletInputStream getInputStream() {
            ByteArrayInputStream in = new ByteArrayInputStream(body);
            return new ServletInputStream() {
                @Override public int read() { return in.read(); }
                @Override public int read(byte[] b, int off, int len) { return in.read(b, off, len); }
                @Override public boolean isFinished() { return in.available() == 0; }
                @Override public boolean isReady() { return true; }
                @Override public void setReadListener(ReadListener listener) { throw new UnsupportedOperationException(); }
            };
        }

        @Override
        public BufferedReader getReader() {
            String enc = getCharacterEncoding();
            Charset cs = enc == null ? StandardCharsets.UTF_8 : Charset.forName(enc);
            return new BufferedReader(new InputStreamReader(getInputStream(), cs));
        }

        @Override
        public int getContentLength() { return body.length; }

        @Override
        public long getContentLengthLong() { return body.length; }

        // A form's fields: the container would parse them from the stream,
        // which the filter has read, so they are parsed here from the same
        // bytes (query string first, then the body, as the container does).
        private Map<String, String[]> params;

        private Map<String, String[]> params() {
            if (params != null) return params;
            String type = getContentType();
            if (type == null || !type.toLowerCase(java.util.Locale.ROOT).startsWith("application/x-www-form-urlencoded")) {
                return params = super.getParameterMap();
            }
            String enc = getCharacterEncoding();
            Charset cs = enc == null ? StandardCharsets.UTF_8 : Charset.forName(enc);
            Map<String, List<String>> acc = new java.util.LinkedHashMap<>();
            addFields(acc, getQueryString(), cs);
            addFields(acc, new String(body, cs), cs);
            Map<String, String[]> out = new java.util.LinkedHashMap<>();
            acc.forEach((k, v) -> out.put(k, v.toArray(new String[0])));
            return params = java.util.Collections.unmodifiableMap(out);
        }

        private static void addFields(Map<String, List<String>> acc, String encoded, Charset cs) {
            if (encoded == null || encoded.isEmpty()) return;
            for (String pair : encoded.split("&")) {
                if (pair.isEmpty()) continue;
                int eq = pair.indexOf('=');
                String k = java.net.URLDecoder.decode(eq < 0 ? pair : pair.substring(0, eq), cs);
                String v = eq < 0 ? "" : java.net.URLDecoder.decode(pair.substring(eq + 1), cs);
                acc.computeIfAbsent(k, x -> new ArrayList<>()).add(v);
            }
        }

        @Override
        public String getParameter(String name) {
            String[] v = params().get(name);
            return v == null || v.length == 0 ? null : v[0];
        }

        @Override
        public Map<String, String[]> getParameterMap() { return params(); }

        @Override
        public java.util.Enumeration<String> getParameterNames() { return java.util.Collections.enumeration(params().keySet()); }

        @Override
        public String[] getParameterValues(String name) { return params().get(name); }
    }
}
