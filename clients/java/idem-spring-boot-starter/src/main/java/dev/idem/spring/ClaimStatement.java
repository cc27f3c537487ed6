package dev.idem.spring;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.time.Duration;

/**
 * The claim as the filter and the {@code @Idempotent} advice send it: one
 * statement, so one round trip (pgJDBC sends the transaction's BEGIN with
 * it), the bound of a duplicate's wait included. For the middleware.
 */
public final class ClaimStatement {
    private ClaimStatement() { }

    /**
     * The bounded form: lock_timeout made transaction-local before the claim
     * (the MATERIALIZED CTE is evaluated first: the claim's key comes from
     * it) and the caller's setting restored after it (the select list is
     * evaluated on the claim's row), so that the business statements after
     * the claim keep the session's lock_timeout.
     */
    private static final String BOUNDED = "WITH s AS MATERIALIZED (SELECT ?::text AS k, current_setting('lock_timeout') AS prev,"
            + " set_config('lock_timeout', ?, true) AS bound) SELECT c.claimed, c.state, c.result::text, c.expires_at,"
            + " set_config('lock_timeout', s.prev, true)"
            + " FROM s, LATERAL %sidem_claim(s.k, ?, ttl => ?::interval, fingerprint => ?, wait => ?, lease => ?::interval) c";
    private static final String PLAIN = "SELECT claimed, state, result::text, expires_at FROM %sidem_claim(?, ?, ttl => ?::interval,"
            + " fingerprint => ?, wait => ?, lease => ?::interval)";

    /** The two statements per schema prefix (one or two in an application), formatted once, not per request. */
    private static final java.util.concurrent.ConcurrentMap<String, String[]> SQL = new java.util.concurrent.ConcurrentHashMap<>();

    /**
     * The claim of key, ready to execute: its row is (claimed, state,
     * result as text, expires_at). lockTimeout: the bound of the wait for a
     * concurrent claim (null or zero: the session's); ttl and lease:
     * PostgreSQL intervals or null; schemaPrefix: "" or a quoted schema and
     * a dot.
     */
    public static PreparedStatement prepare(Connection con, String schemaPrefix, String key, String bizType, String ttl,
                                            String fingerprint, boolean wait, Duration lockTimeout, String lease) throws SQLException {
        boolean bounded = wait && lockTimeout != null && lockTimeout.toMillis() > 0;
        String[] sql = SQL.computeIfAbsent(schemaPrefix, p -> new String[] {String.format(BOUNDED, p), String.format(PLAIN, p)});
        PreparedStatement st = con.prepareStatement(sql[bounded ? 0 : 1]);
        try {
            int i = 1;
            st.setString(i++, key);
            if (bounded) st.setString(i++, lockTimeout.toMillis() + "ms");
            st.setString(i++, bizType);
            st.setString(i++, ttl);
            st.setString(i++, fingerprint);
            st.setBoolean(i++, wait);
            st.setString(i, lease);
            return st;
        } catch (SQLException | RuntimeException e) {
            st.close();
            throw e;
        }
    }
}
