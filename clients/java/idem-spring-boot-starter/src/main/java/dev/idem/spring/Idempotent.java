package dev.idem.spring;

import java.lang.annotation.Documented;
import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

/**
 * Runs the method at most once per key: {@code idem_claim(key, bizType)} on the
 * connection of the caller's transaction, the method only when the claim is
 * new, its return value stored with {@code idem_complete} (as JSON, through
 * the application's ObjectMapper), and a duplicate gets that stored value
 * back, read as the method's return type, without running the method.
 *
 * <p>The method must run inside a Spring-managed transaction on the
 * application's DataSource ({@code @Transactional} on it or on its caller);
 * a call outside one is refused with
 * {@link org.springframework.transaction.IllegalTransactionStateException}.
 * A rollback undoes the claim with the work, so a retry runs the work again.
 * See clients/java/README.md.
 */
@Target(ElementType.METHOD)
@Retention(RetentionPolicy.RUNTIME)
@Documented
public @interface Idempotent {

    /** The business type: {@code ^[A-Za-z0-9_.:-]{1,64}$}. */
    String bizType();

    /**
     * SpEL over the method's arguments ({@code #cmd.requestId}, {@code #p0})
     * giving the key: a name of the business intent made by the client
     * before its retry loop, never a value made per attempt.
     */
    String key();

    /**
     * SpEL giving the fingerprint: a duplicate whose fingerprint differs from
     * the first call's is refused with {@link IdempotencyKeyReusedException}
     * (SQLSTATE ID001). Empty (the default): the SHA-256 of the arguments as
     * JSON (the application's ObjectMapper, properties and map keys sorted).
     * {@code "null"}: no fingerprint.
     */
    String fingerprint() default "";

    /** The claim's TTL as a PostgreSQL interval ("7 days"); empty: the business type's, else idem.default_ttl. */
    String ttl() default "";

    /**
     * true (the default): a duplicate that arrives while the first call's
     * transaction is open waits for it (at most {@code idem.wait-timeout}),
     * then gets its result. false: it gets {@link IdempotencyInProgressException} at once.
     */
    boolean waitForFirst() default true;
}
