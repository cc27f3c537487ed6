package dev.idem.spring;

/**
 * SQLSTATE ID001: the key was first used with a different fingerprint (a
 * different request under the same key). Nothing changed; the transaction
 * is aborted by the error and rolls back. HTTP: 422.
 */
public class IdempotencyKeyReusedException extends IdempotencyException {
    public IdempotencyKeyReusedException(String message, String bizType, String key, Throwable cause) {
        super(message, bizType, key, "ID001", cause);
    }
}
