package dev.idem.spring;

import java.lang.reflect.Method;
import java.lang.reflect.Type;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.HexFormat;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Supplier;
import javax.sql.DataSource;
import org.aopalliance.intercept.MethodInterceptor;
import org.aopalliance.intercept.MethodInvocation;
import org.springframework.aop.support.AopUtils;
import org.springframework.context.expression.MethodBasedEvaluationContext;
import org.springframework.core.DefaultParameterNameDiscoverer;
import org.springframework.core.ParameterNameDiscoverer;
import org.springframework.core.ResolvableType;
import org.springframework.core.annotation.AnnotatedElementUtils;
import org.springframework.expression.Expression;
import org.springframework.expression.spel.standard.SpelExpressionParser;
import org.springframework.jdbc.datasource.ConnectionHolder;
import org.springframework.jdbc.datasource.DataSourceUtils;
import org.springframework.jdbc.support.SQLErrorCodeSQLExceptionTranslator;
import org.springframework.transaction.IllegalTransactionStateException;
import org.springframework.transaction.support.TransactionSynchronization;
import org.springframework.transaction.support.TransactionSynchronizationManager;

/**
 * The advice behind {@link Idempotent}: claim on the transaction's own
 * connection, run, complete; or replay. Ordered inside the transaction
 * advice (see IdemAutoConfiguration), so that @Transactional and
 * @Idempotent may sit on the same method.
 */
final class IdempotentInterceptor implements MethodInterceptor {
    private final Supplier<DataSource> dataSource;
    private final Supplier<IdemJson> json;
    private final Supplier<IdemProperties> properties;
    private final SpelExpressionParser parser = new SpelExpressionParser();
    private final ParameterNameDiscoverer parameterNames = new DefaultParameterNameDiscoverer();
    private final Map<String, Expression> expressions = new ConcurrentHashMap<>();

    IdempotentInterceptor(Supplier<DataSource> dataSource, Supplier<IdemJson> json, Supplier<IdemProperties> properties) {
        this.dataSource = dataSource;
        this.json = json;
        this.properties = properties;
    }

    @Override
    public Object invoke(MethodInvocation invocation) throws Throwable {
        Class<?> targetClass = invocation.getThis() != null
                ? AopUtils.getTargetClass(invocation.getThis()) : invocation.getMethod().getDeclaringClass();
        Method method = AopUtils.getMostSpecificMethod(invocation.getMethod(), targetClass);
        Idempotent spec = AnnotatedElementUtils.findMergedAnnotation(method, Idempotent.class);
        if (spec == null) {
            spec = AnnotatedElementUtils.findMergedAnnotation(invocation.getMethod(), Idempotent.class);
        }
        if (spec == null) { // the pointcut matched it: never run such a method unprotected
            throw new IllegalStateException("@Idempotent not found on " + method + " although its advice was applied");
        }
        String where = targetClass.getSimpleName() + "." + method.getName();
        // Never silently unprotected: without the caller's transaction the
        // claim would commit on its own and a failure of the work would leave
        // the key used with no result.
        if (!TransactionSynchronizationManager.isActualTransactionActive()) {
            throw new IllegalTransactionStateException("@Idempotent method " + where + " was called outside a transaction:"
                    + " idem_claim must run in the transaction that does the method's work (annotate the method or its"
                    + " caller with @Transactional, or call it inside TransactionTemplate.execute)");
        }
        if (TransactionSynchronizationManager.isCurrentTransactionReadOnly()) {
            throw new IllegalTransactionStateException("@Idempotent method " + where + " was called in a read-only transaction:"
                    + " a claim is a write");
        }
        DataSource ds = dataSource.get();
        if (!(TransactionSynchronizationManager.getResource(ds) instanceof ConnectionHolder)) {
            throw new IllegalTransactionStateException("@Idempotent method " + where + ": the current transaction holds no"
                    + " connection of the application's DataSource (a transaction manager of another DataSource, or JTA):"
                    + " the claim would not be part of the transaction");
        }

        MethodBasedEvaluationContext context = new MethodBasedEvaluationContext(
                invocation.getThis(), method, invocation.getArguments(), parameterNames);
        Object keyValue = expression(spec.key()).getValue(context);
        if (keyValue == null || keyValue.toString().isEmpty()) {
            throw new IllegalArgumentException("@Idempotent key \"" + spec.key() + "\" of " + where + " gave "
                    + (keyValue == null ? "null" : "an empty string") + ": a request without its idempotency key cannot be deduplicated");
        }
        String key = keyValue.toString();
        String bizType = spec.bizType();
        String fingerprint;
        if (spec.fingerprint().isEmpty()) {
            fingerprint = sha256(json.get().canonical(invocation.getArguments()));
        } else {
            Object f = expression(spec.fingerprint()).getValue(context);
            fingerprint = f == null ? null : f.toString();
        }

        Connection con = DataSourceUtils.getConnection(ds);
        try {
            if (con.getAutoCommit()) { // a holder whose connection is not in a transaction: refuse as above
                throw new IllegalTransactionStateException("@Idempotent method " + where + ": the transaction's connection is in"
                        + " autocommit mode, so the claim would commit at once");
            }
            Claim claim = claim(con, key, bizType, spec, fingerprint, ds);
            if (claim.claimed) {
                return runAndComplete(invocation, con, key, bizType, claim.result, ds);
            }
            return replay(claim, method, targetClass, key, bizType, where);
        } finally {
            DataSourceUtils.releaseConnection(con, ds);
        }
    }

    private record Claim(boolean claimed, String state, String result) { }

    /** The claim, its wait bounded by idem.wait-timeout: one statement, one round trip (with the transaction's BEGIN if it is the first). */
    private Claim claim(Connection con, String key, String bizType, Idempotent spec, String fingerprint, DataSource ds) {
        try (PreparedStatement st = ClaimStatement.prepare(con, prefix(), key, bizType, spec.ttl().isEmpty() ? null : spec.ttl(),
                fingerprint, spec.waitForFirst(), properties.get().getWaitTimeout(), null);
             ResultSet rs = st.executeQuery()) {
            rs.next();
            return new Claim(rs.getBoolean(1), rs.getString(2), rs.getString(3));
        } catch (SQLException e) {
            String state = e.getSQLState();
            if ("ID001".equals(state)) {
                throw new IdempotencyKeyReusedException("key " + key + " of " + bizType + " was first used for a different request"
                        + " (another fingerprint): " + e.getMessage(), bizType, key, e);
            }
            if ("55P03".equals(state) || "57014".equals(state)) {
                throw new IdempotencyInProgressException("key " + key + " of " + bizType + ": the first call's transaction is"
                        + " still open after the wait (" + state + "); retry later", bizType, key, state, e);
            }
            throw translate(ds, "idem_claim", e);
        }
    }

    /** told: what idem_claim answered the new claim (its attempt and previous error: IdemClaim.current() in the method). */
    private Object runAndComplete(MethodInvocation invocation, Connection con, String key, String bizType, String told, DataSource ds)
            throws Throwable {
        Guard guard = new Guard(key, bizType);
        TransactionSynchronizationManager.registerSynchronization(guard);
        Object result;
        try (IdemClaim.Scope bound = IdemClaim.told(key, bizType, told).bind()) {
            result = invocation.proceed();
        } catch (Throwable t) {
            guard.failure = t; // the commit, if one comes, is refused with it as the cause
            throw t;
        }
        String stored = result == null ? null : json.get().write(result);
        String sql = "SELECT " + prefix() + "idem_complete(?, ?, ?::jsonb)";
        try (PreparedStatement st = con.prepareStatement(sql)) {
            st.setString(1, key);
            st.setString(2, bizType);
            st.setString(3, stored);
            st.executeQuery().close();
        } catch (SQLException e) {
            throw translate(ds, sql, e);
        }
        guard.completed = true;
        return result;
    }

    private Object replay(Claim claim, Method method, Class<?> targetClass, String key, String bizType, String where) {
        switch (claim.state) {
            case "completed": {
                Type type = ResolvableType.forMethodReturnType(method, targetClass).getType();
                if (type == void.class || type == Void.class || claim.result == null) {
                    if (method.getReturnType().isPrimitive() && method.getReturnType() != void.class) {
                        throw new IdempotencyException("key " + key + " of " + bizType + " completed without a stored result,"
                                + " which " + where + " cannot return as " + method.getReturnType(), bizType, key, null, null);
                    }
                    return null;
                }
                return json.get().read(claim.result, type);
            }
            case "failed":
                throw new IdempotencyFailedException("key " + key + " of " + bizType + " failed the first time: " + claim.result,
                        bizType, key, claim.result);
            default: // in_progress
                throw new IdempotencyInProgressException("key " + key + " of " + bizType + " is in progress (not waited for,"
                        + " a lease, or claimed earlier in this transaction); retry later", bizType, key, null, null);
        }
    }

    private String prefix() {
        String schema = properties.get().getSchema();
        return schema == null || schema.isEmpty() ? "" : "\"" + schema.replace("\"", "\"\"") + "\".";
    }

    private static RuntimeException translate(DataSource ds, String sql, SQLException e) {
        RuntimeException translated = new SQLErrorCodeSQLExceptionTranslator(ds).translate("idem", sql, e);
        return translated != null ? translated : new IllegalStateException(e.getMessage(), e);
    }

    private Expression expression(String text) {
        return expressions.computeIfAbsent(text, parser::parseExpression);
    }

    private static String sha256(String text) {
        try {
            return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(text.getBytes(StandardCharsets.UTF_8)));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    /**
     * Refuses a commit of a claim whose method threw: committed, the key
     * would stay used with no result, and a retry would get null instead of
     * running the work. That commit comes after a checked exception (which
     * @Transactional commits by default) or one the caller caught. Not a
     * silent rollback-only mark: the caller learns that its transaction
     * did not commit.
     */
    private static final class Guard implements TransactionSynchronization {
        private final String key;
        private final String bizType;
        volatile boolean completed;
        volatile Throwable failure;

        Guard(String key, String bizType) {
            this.key = key;
            this.bizType = bizType;
        }

        @Override
        public void beforeCommit(boolean readOnly) {
            if (!completed) {
                throw new IdempotencyException("key " + key + " of " + bizType + ": the @Idempotent method threw " + failure
                        + ", so its claim may not commit (a retry must run the work again); the transaction is rolled back",
                        bizType, key, null, failure);
            }
        }
    }
}
