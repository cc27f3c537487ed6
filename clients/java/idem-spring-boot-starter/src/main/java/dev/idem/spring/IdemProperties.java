package dev.idem.spring;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import org.springframework.boot.context.properties.ConfigurationProperties;

/** Settings of the idem starter ({@code idem.*} in application.properties). */
@ConfigurationProperties(prefix = "idem")
public class IdemProperties {

    /**
     * Longest wait of a duplicate for the first call's open transaction
     * (lock_timeout for the claim statement alone; restored after it).
     * 0: the session's own lock_timeout.
     */
    private Duration waitTimeout = Duration.ofSeconds(10);

    /** Schema of idem's functions when it is not on the search_path. */
    private String schema;

    /** The Idempotency-Key filter (routes marked {@code @IdempotentRequest}). */
    private final Http http = new Http();

    public Http getHttp() { return http; }

    /** {@code idem.http.*}: the rules of docs/http.md, with the same defaults as the other idem clients. */
    public static class Http {
        /** The request header. */
        private String header = "Idempotency-Key";
        /** Shortest and longest key (characters; at most 255). */
        private int minKeyLength = 16;
        private int maxKeyLength = 255;
        /** Also accept an unquoted key (Stripe-style clients). */
        private boolean bareKeys;
        /** No tenant hook: every caller shares one key space ("-:<key>"). */
        private boolean singleTenant;
        /** With a tenant hook: a request without a tenant is claimed in the shared scope instead of refused with 500. */
        private boolean anonymous;
        /** Longest wait of a duplicate for the first request's transaction (then 409); 0 or negative: the session's lock_timeout. */
        private Duration lockTimeout = Duration.ofSeconds(5);
        /** Retry-After of a 409 and a 503, in seconds. */
        private int retryAfter = 1;
        /** Response headers stored and replayed with the status and the body. */
        private List<String> storedHeaders = new ArrayList<>(List.of("Content-Type", "Location"));
        /** Larger bodies are sent but not stored (a replay has the status and headers and an empty body). */
        private int maxStoredBody = 256 * 1024;
        /** A problem's "type" is this base followed by its slug: point it at your API's documentation. */
        private String problemBase = "https://github.com/idem-pg/idem/blob/main/docs/http.md#";
        /** JSON fields (top-level names or dotted paths) left out of every fingerprint. */
        private List<String> excludeFields = new ArrayList<>();

        public String getHeader() { return header; }
        public void setHeader(String header) { this.header = header; }
        public int getMinKeyLength() { return minKeyLength; }
        public void setMinKeyLength(int minKeyLength) { this.minKeyLength = minKeyLength; }
        public int getMaxKeyLength() { return maxKeyLength; }
        public void setMaxKeyLength(int maxKeyLength) { this.maxKeyLength = maxKeyLength; }
        public boolean isBareKeys() { return bareKeys; }
        public void setBareKeys(boolean bareKeys) { this.bareKeys = bareKeys; }
        public boolean isSingleTenant() { return singleTenant; }
        public void setSingleTenant(boolean singleTenant) { this.singleTenant = singleTenant; }
        public boolean isAnonymous() { return anonymous; }
        public void setAnonymous(boolean anonymous) { this.anonymous = anonymous; }
        public Duration getLockTimeout() { return lockTimeout; }
        public void setLockTimeout(Duration lockTimeout) { this.lockTimeout = lockTimeout; }
        public int getRetryAfter() { return retryAfter; }
        public void setRetryAfter(int retryAfter) { this.retryAfter = retryAfter; }
        public List<String> getStoredHeaders() { return storedHeaders; }
        public void setStoredHeaders(List<String> storedHeaders) { this.storedHeaders = storedHeaders; }
        public int getMaxStoredBody() { return maxStoredBody; }
        public void setMaxStoredBody(int maxStoredBody) { this.maxStoredBody = maxStoredBody; }
        public String getProblemBase() { return problemBase; }
        public void setProblemBase(String problemBase) { this.problemBase = problemBase; }
        public List<String> getExcludeFields() { return excludeFields; }
        public void setExcludeFields(List<String> excludeFields) { this.excludeFields = excludeFields; }
    }

    public Duration getWaitTimeout() { return waitTimeout; }
    public void setWaitTimeout(Duration waitTimeout) { this.waitTimeout = waitTimeout; }
    public String getSchema() { return schema; }
    public void setSchema(String schema) { this.schema = schema; }
}
