package dev.idem.spring;

import dev.idem.spring.web.Json;
import java.util.Map;

/**
 * The claim the running code was given: which attempt this is, and the
 * error the previous attempt stored. {@code idem_claim} tells a new claim
 * {@code {attempt, previous_error}} when it retries a stored failure (the
 * business type's {@code idem_configure(…, on_failure => 'retry')}), and a
 * takeover of a lease its attempt; a first claim is attempt 1 with no
 * previous error.
 *
 * <p>{@link #current()} is the claim of the {@code @IdempotentRequest}
 * handler or the {@code @Idempotent} method running on this thread (the
 * innermost, if one calls another), null outside them and for a request
 * without a key on a route whose key is optional. The filter also sets it
 * as the request attribute {@link #ATTRIBUTE}.
 */
public final class IdemClaim {
    /** The request attribute the Idempotency-Key filter sets to the request's claim. */
    public static final String ATTRIBUTE = IdemClaim.class.getName();
    private static final ThreadLocal<IdemClaim> CURRENT = new ThreadLocal<>();

    private final String key;
    private final String bizType;
    private final int attempt;
    private final String previousError;

    private IdemClaim(String key, String bizType, int attempt, String previousError) {
        this.key = key;
        this.bizType = bizType;
        this.attempt = attempt;
        this.previousError = previousError;
    }

    /**
     * The claim of key, from what idem_claim answered a new claim (its
     * result as JSON text: null, {attempt, previous_error}, or a lease
     * document). For the middleware; applications read {@link #current()}.
     */
    public static IdemClaim told(String key, String bizType, String result) {
        int attempt = 1;
        String previous = null;
        if (result != null && Json.parse(result) instanceof Map<?, ?> doc) {
            if (doc.get("attempt") instanceof Json.Num n) attempt = Math.max((int) n.value(), 1);
            Object error = doc.get("previous_error");
            if (error != null && error != Json.NULL) previous = Json.canonical(error);
        }
        return new IdemClaim(key, bizType, attempt, previous);
    }

    /** The claim of the idempotent code running on this thread, or null. */
    public static IdemClaim current() {
        return CURRENT.get();
    }

    /**
     * Makes this the current claim until the returned scope is closed (then
     * the one before it is current again). For the middleware.
     */
    public Scope bind() {
        IdemClaim before = CURRENT.get();
        CURRENT.set(this);
        return () -> {
            if (before == null) {
                CURRENT.remove();
            } else {
                CURRENT.set(before);
            }
        };
    }

    /** What {@link #bind()} returns: closing it ends the binding. */
    @FunctionalInterface
    public interface Scope extends AutoCloseable {
        @Override
        void close();
    }

    /** The claimed key (for the filter: its tenant scope included). */
    public String key() { return key; }

    public String bizType() { return bizType; }

    /** 1 for a first claim; 2, 3, ... when a stored failure is retried or a lease taken over. */
    public int attempt() { return attempt; }

    /**
     * The error the previous attempt stored with idem_fail, as JSON text
     * (the filter's stored response: {@code {"status": 422, "headers": …,
     * "body": …}}), when this claim retries it; else null.
     */
    public String previousError() { return previousError; }
}
