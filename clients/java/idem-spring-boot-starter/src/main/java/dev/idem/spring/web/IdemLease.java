package dev.idem.spring.web;

import jakarta.servlet.http.HttpServletRequest;

/**
 * The leased claim of a request on a route in lease mode
 * ({@link IdempotentRequest#lease()}), for its handler: which attempt this
 * is (1, or 2, 3, ... after a lease that ran out or was released was taken
 * over), and the last recovery point an earlier attempt recorded, so as
 * not to repeat an external call made before it. {@link #checkpoint}
 * records a point (and renews the lease).
 */
public final class IdemLease {
    static final String ATTRIBUTE = IdemLease.class.getName();

    /** Records a point in a transaction of its own, committed at once. */
    interface Checkpointer {
        void checkpoint(IdemLease lease, String point, String dataJson);
    }

    private final String key;
    private final String bizType;
    private final String token;
    private final int attempt;
    private volatile String recoveryPoint;
    private volatile String recoveryData;
    private final Checkpointer checkpointer;

    IdemLease(String key, String bizType, String token, int attempt, String recoveryPoint, String recoveryData,
              Checkpointer checkpointer) {
        this.key = key;
        this.bizType = bizType;
        this.token = token;
        this.attempt = attempt;
        this.recoveryPoint = recoveryPoint;
        this.recoveryData = recoveryData;
        this.checkpointer = checkpointer;
    }

    /** The request's lease, or null (no lease mode on its route, or no key on an optional one). */
    public static IdemLease of(HttpServletRequest request) {
        return request.getAttribute(ATTRIBUTE) instanceof IdemLease l ? l : null;
    }

    /** The claimed key, its tenant scope included. */
    public String key() { return key; }

    public String bizType() { return bizType; }

    /** The lease token (idem_complete, idem_fail, idem_checkpoint and idem_release take it). */
    public String token() { return token; }

    /** 1 for the first attempt, 2, 3, ... after a takeover. */
    public int attempt() { return attempt; }

    /** The last recovery point recorded (by an earlier attempt, or this one), or null. */
    public String recoveryPoint() { return recoveryPoint; }

    /** Its data as JSON text, or null. */
    public String recoveryData() { return recoveryData; }

    /**
     * idem_checkpoint: records point (and data, JSON text or null) and renews
     * the lease, in a transaction of its own committed at once: the
     * request's own transaction may still roll back, and an attempt that
     * takes the lease over must find the point.
     */
    public void checkpoint(String point, String dataJson) {
        checkpointer.checkpoint(this, point, dataJson);
        recoveryPoint = point;
        recoveryData = dataJson;
    }
}
