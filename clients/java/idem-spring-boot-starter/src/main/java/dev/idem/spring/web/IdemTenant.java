package dev.idem.spring.web;

import jakarta.servlet.http.HttpServletRequest;

/**
 * The tenant of a request: the authenticated caller's account (never a
 * header the client chooses), or null / "" for none. Declare one as a bean,
 * or set {@code idem.http.single-tenant=true}; the filter refuses to start
 * with neither (one caller could be replayed another's response).
 */
@FunctionalInterface
public interface IdemTenant {
    String tenant(HttpServletRequest request);
}
