package dev.idem.spring.web;

import java.lang.annotation.Documented;
import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;
import java.util.function.IntPredicate;

/**
 * Makes a Spring MVC handler method idempotent by the request's
 * {@code Idempotency-Key} header (docs/http.md, "The rules"): the
 * {@link IdempotencyKeyFilter} opens the request's transaction, claims the
 * key in it, runs the handler in it (JdbcTemplate, JPA and {@code @Transactional}
 * methods join it), stores the response with the handler's writes and
 * commits; a duplicate gets the stored response back. See clients/java/README.md.
 */
@Target(ElementType.METHOD)
@Retention(RetentionPolicy.RUNTIME)
@Documented
public @interface IdempotentRequest {
    /** idem's business type, one per operation: {@code ^[A-Za-z0-9_.:-]{1,64}$}. */
    String bizType();

    /** A request without the header runs without idempotency (in a transaction all the same) instead of 400. */
    boolean keyOptional() default false;

    /** false: a duplicate of a request still running gets 409 at once instead of waiting for its outcome. */
    boolean waitForFirst() default true;

    /** This route's bound of a duplicate's wait ("200ms", "5s"); empty: idem.http.lock-timeout. */
    String lockTimeout() default "";

    /** The claims' TTL as a PostgreSQL interval ("7 days"); empty: the business type's, else idem.default_ttl. */
    String ttl() default "";

    /** A request whose tenant hook gives no tenant is claimed in the shared scope instead of refused (500). */
    boolean anonymous() default false;

    /** JSON fields (top-level names or dotted paths) left out of the fingerprint. */
    String[] excludeFields() default {};

    /** Which statuses are stored; the others roll back (a class with a no-argument constructor). */
    Class<? extends IntPredicate> store() default DefaultStore.class;

    /**
     * Lease mode, for a handler that calls a service outside the database (a
     * payment provider): the lease's length as a PostgreSQL interval ("60
     * seconds"; at most the TTL); empty: none. The claim commits before the
     * handler runs, so that it outlives a crash of the process; the handler's
     * writes and the stored response (stored with the lease token) are a
     * second transaction, which the handler joins as usual. A duplicate
     * meanwhile gets 409 at once; a handler whose answer is not stored (5xx,
     * 401/403/429, an exception) hands the lease back (idem_release), and the
     * client's retry takes it over at once ({@link IdemLease#of}: its attempt
     * and the last recovery point); after a lost process, once it ran out.
     */
    String lease() default "";

    /** Seconds of Retry-After on this route's 409 and 503 (a leased route: about its lease); 0: idem.http.retry-after. */
    int retryAfter() default 0;
}
