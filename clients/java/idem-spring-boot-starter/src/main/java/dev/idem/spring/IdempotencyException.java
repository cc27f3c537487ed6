package dev.idem.spring;

/**
 * An @Idempotent call that did not run and has no stored result to return.
 * The subclasses say why; {@link #getSqlState()} is idem's SQLSTATE where
 * the database gave one.
 */
public class IdempotencyException extends RuntimeException {
    private final String bizType;
    private final String key;
    private final String sqlState;

    public IdempotencyException(String message, String bizType, String key, String sqlState, Throwable cause) {
        super(message, cause);
        this.bizType = bizType;
        this.key = key;
        this.sqlState = sqlState;
    }

    public String getBizType() { return bizType; }
    public String getKey() { return key; }
    /** The SQLSTATE of the database error behind this exception, or null. */
    public String getSqlState() { return sqlState; }
}
