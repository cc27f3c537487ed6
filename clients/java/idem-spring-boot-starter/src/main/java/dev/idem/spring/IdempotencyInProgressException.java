package dev.idem.spring;

/**
 * The first call with this key has not finished: its transaction was still
 * open after {@code idem.wait-timeout} (SQLSTATE 55P03 lock_not_available, or
 * 57014 when a statement_timeout ended the wait first), the annotation says
 * {@code waitForFirst = false}, a lease runs, or this very transaction
 * claimed the key before. Retry later; HTTP: 409 with Retry-After. After a
 * database error the transaction is aborted and rolls back.
 */
public class IdempotencyInProgressException extends IdempotencyException {
    public IdempotencyInProgressException(String message, String bizType, String key, String sqlState, Throwable cause) {
        super(message, bizType, key, sqlState, cause);
    }
}
