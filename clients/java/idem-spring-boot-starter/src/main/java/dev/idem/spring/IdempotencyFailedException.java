package dev.idem.spring;

/**
 * The key's first outcome is a stored business failure
 * ({@code idem_fail}, state {@code failed}): {@link #getError()} is its JSON.
 */
public class IdempotencyFailedException extends IdempotencyException {
    private final String error;

    public IdempotencyFailedException(String message, String bizType, String key, String error) {
        super(message, bizType, key, null, null);
        this.error = error;
    }

    /** The stored error document (JSON text), or null. */
    public String getError() { return error; }
}
