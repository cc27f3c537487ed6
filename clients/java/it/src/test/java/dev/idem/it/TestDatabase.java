package dev.idem.it;

import java.io.IOException;
import java.nio.file.Path;

/**
 * The database of the tests: -Didem.it.pghost (a socket directory, which is
 * forwarded to TCP for pgJDBC, or a host), -Didem.it.pgport,
 * -Didem.it.database (idem installed), user postgres.
 */
final class TestDatabase {
    private static String url;

    private TestDatabase() { }

    /** The JDBC URL (with a query string: append "&…"); the forwarder lives as long as the test JVM. */
    static synchronized String jdbcUrl() throws IOException {
        if (url == null) {
            String host = required("idem.it.pghost");
            String port = required("idem.it.pgport");
            String hostPort = host + ":" + port;
            if (host.startsWith("/")) {
                UnixSocketForwarder forwarder = new UnixSocketForwarder(Path.of(host, ".s.PGSQL." + port));
                hostPort = "127.0.0.1:" + forwarder.port();
            }
            url = "jdbc:postgresql://" + hostPort + "/" + required("idem.it.database") + "?user=postgres";
        }
        return url;
    }

    private static String required(String name) {
        String v = System.getProperty(name);
        if (v == null || v.isEmpty()) throw new IllegalStateException("-D" + name + " is required (tests/scenarios/clients.sh java_spring)");
        return v;
    }
}
