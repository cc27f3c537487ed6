package dev.idem.spring;

import java.time.Duration;
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

    public Duration getWaitTimeout() { return waitTimeout; }
    public void setWaitTimeout(Duration waitTimeout) { this.waitTimeout = waitTimeout; }
    public String getSchema() { return schema; }
    public void setSchema(String schema) { this.schema = schema; }
}
