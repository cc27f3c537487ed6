package dev.idem.spring.web;

import java.util.Set;
import java.util.function.IntPredicate;

/**
 * Which statuses are stored (docs/http.md, "What is stored"): 2xx and 3xx
 * with idem_complete, the 4xx that describe the request (400, 404, 409,
 * 422, ...) with idem_fail; never 401, 403, 407, 408, 425, 429 (they say
 * nothing about the operation, only about this attempt) or 5xx: those roll
 * back, claim included, so that a retry runs the operation.
 */
public class DefaultStore implements IntPredicate {
    public static final Set<Integer> TRANSIENT_REFUSALS = Set.of(401, 403, 407, 408, 425, 429);

    @Override
    public boolean test(int status) {
        return !TRANSIENT_REFUSALS.contains(status) && status >= 200 && status < 500;
    }
}
