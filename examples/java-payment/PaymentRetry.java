// A payment call with a retry loop, over JDBC, when the answer to COMMIT is
// lost on the network: the charge committed, the client saw a broken
// connection and cannot know whether it did.
//
// The right way: make the request key ONCE per payment intent, BEFORE the
// retry loop, and send the same key on every attempt. The retry then meets
// the first attempt's committed claim and gets its stored result back: the
// card is charged once. The anti-pattern (shown second, clearly labelled):
// a key made INSIDE the loop is a new key per attempt, and the retry charges
// the card a second time.
//
// Between the program and PostgreSQL sits FlakyLink, a TCP relay on
// 127.0.0.1 that can be told to lose the server's answer to the next COMMIT
// (it forwards the COMMIT, then closes both sides when the answer comes).
// JDBC connects to the relay; the relay reaches the server over its Unix
// socket (PGHOST is a directory) or TCP.
//
// Build and run (Debian: default-jdk-headless, libpostgresql-jdbc-java):
//   javac -d out PaymentRetry.java
//   PGHOST=... PGPORT=... PGUSER=... PGDATABASE=... java -cp out:/usr/share/java/postgresql.jar PaymentRetry
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicBoolean;

public class PaymentRetry {
    static final String BIZ_TYPE = "card-charge";
    static final int MAX_ATTEMPTS = 3;

    // ---- the payment service: one transaction per call ----------------------

    record Outcome(boolean replayed, String result) {}

    /** Charge the card once per request key; a repeated key gets the first result back. */
    static Outcome charge(Connection db, String requestKey, String orderNo, int amountCents, String log)
            throws SQLException {
        db.setAutoCommit(false);
        try {
            String fingerprint = orderNo + ":" + amountCents;
            boolean claimed;
            String stored;
            // Waits (the default) if an earlier attempt's transaction is still
            // open on the server, and then gets its outcome.
            try (PreparedStatement ps = db.prepareStatement(
                    "SELECT claimed, result::text FROM idem_claim(?, ?, fingerprint => ?)")) {
                ps.setString(1, requestKey);
                ps.setString(2, BIZ_TYPE);
                ps.setString(3, fingerprint);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    claimed = rs.getBoolean(1);
                    stored = rs.getString(2);
                }
            }
            if (!claimed) {
                db.commit();
                return new Outcome(true, stored);
            }
            long chargeId;
            try (PreparedStatement ps = db.prepareStatement(
                    "INSERT INTO card_charges (request_key, order_no, amount_cents) VALUES (?, ?, ?) RETURNING id")) {
                ps.setString(1, requestKey);
                ps.setString(2, orderNo);
                ps.setInt(3, amountCents);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    chargeId = rs.getLong(1);
                }
            }
            String result = String.format("{\"charge_id\": %d, \"amount_cents\": %d}", chargeId, amountCents);
            try (PreparedStatement ps = db.prepareStatement("SELECT idem_complete(?, ?, ?::jsonb)")) {
                ps.setString(1, requestKey);
                ps.setString(2, BIZ_TYPE);
                ps.setString(3, result);
                ps.execute();
            }
            System.out.printf("%s: claimed, charged %s (charge %d), COMMIT sent%n", log, money(amountCents), chargeId);
            db.commit();
            return new Outcome(false, result);
        } catch (SQLException e) {
            try { db.rollback(); } catch (SQLException ignored) { /* the connection is gone */ }
            throw e;
        }
    }

    // ---- the client: a retry loop -------------------------------------------

    /** The right way: one key per payment intent, made before the loop. */
    static String payKeyBeforeLoop(String url, FlakyLink link, String orderNo, int cents) throws Exception {
        String requestKey = "pay-" + UUID.randomUUID();
        System.out.printf("order %s: request key %s, made once, before the retry loop%n", orderNo, requestKey);
        for (int attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
            if (attempt == 1) link.loseAnswerToNextCommit();
            try (Connection db = DriverManager.getConnection(url)) {
                Outcome o = charge(db, requestKey, orderNo, cents, "attempt " + attempt);
                System.out.printf("attempt %d: %s, %s%n", attempt,
                        o.replayed() ? "replayed the stored result (an earlier attempt had committed)" : "answer received", o.result());
                return o.result();
            } catch (SQLException e) {
                if (!isConnectionLoss(e)) throw e;
                System.out.printf("attempt %d: no answer to COMMIT (SQLSTATE %s): charged or not? unknown; retrying with the same key%n",
                        attempt, e.getSQLState());
                Thread.sleep(100L * attempt);
            }
        }
        throw new IllegalStateException("no answer after " + MAX_ATTEMPTS + " attempts");
    }

    /** ANTI-PATTERN, for contrast: a new key per attempt charges again on retry. */
    static String payKeyInsideLoop(String url, FlakyLink link, String orderNo, int cents) throws Exception {
        for (int attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
            String requestKey = "pay-" + UUID.randomUUID(); // WRONG: a fresh key every attempt
            if (attempt == 1) link.loseAnswerToNextCommit();
            try (Connection db = DriverManager.getConnection(url)) {
                Outcome o = charge(db, requestKey, orderNo, cents, "ANTI-PATTERN attempt " + attempt + ", key " + requestKey);
                System.out.printf("ANTI-PATTERN attempt %d: %s, %s%n", attempt,
                        o.replayed() ? "replayed" : "answer received", o.result());
                return o.result();
            } catch (SQLException e) {
                if (!isConnectionLoss(e)) throw e;
                System.out.printf("ANTI-PATTERN attempt %d: no answer to COMMIT (SQLSTATE %s); retrying with a NEW key%n",
                        attempt, e.getSQLState());
                Thread.sleep(100L * attempt);
            }
        }
        throw new IllegalStateException("no answer after " + MAX_ATTEMPTS + " attempts");
    }

    static boolean isConnectionLoss(SQLException e) {
        return e.getSQLState() != null && e.getSQLState().startsWith("08");
    }

    static String money(int cents) {
        return String.format("%d.%02d", cents / 100, cents % 100);
    }

    // ---- main -----------------------------------------------------------------

    public static void main(String[] args) throws Exception {
        String host = env("PGHOST", "localhost");
        int port = Integer.parseInt(env("PGPORT", "5432"));
        SocketAddress server = host.startsWith("/")
                ? UnixDomainSocketAddress.of(host + "/.s.PGSQL." + port)
                : new InetSocketAddress(host, port);
        try (FlakyLink link = new FlakyLink(server)) {
            // prepareThreshold=0: no named server-side statements, so that the
            // program also runs behind PgBouncer in transaction mode. With
            // pgjdbc's default (5), commit() sends COMMIT as a named statement
            // ("S_1"), and the next connection given the same server session
            // fails on its own "S_1" with 42P05 (docs/operations.md, "Behind a
            // pooler"). Each statement here runs once per connection anyway.
            String url = String.format("jdbc:postgresql://127.0.0.1:%d/%s?user=%s&ApplicationName=idem-example-java"
                            + "&connectTimeout=10&socketTimeout=30&prepareThreshold=0",
                    link.port(), env("PGDATABASE", "postgres"), env("PGUSER", "postgres"));
            try (Connection db = DriverManager.getConnection(url); Statement st = db.createStatement()) {
                st.execute("CREATE EXTENSION IF NOT EXISTS idem");
                st.execute("CREATE TABLE IF NOT EXISTS card_charges (id bigserial PRIMARY KEY, request_key text NOT NULL,"
                        + " order_no text NOT NULL, amount_cents int NOT NULL, charged_at timestamptz NOT NULL DEFAULT now())");
            }
            // Order numbers of this run, so that runs in the same database do not mix.
            String run = UUID.randomUUID().toString().substring(0, 8);
            String goodOrder = "ORD-" + run + "-A", badOrder = "ORD-" + run + "-B";
            System.out.println("== key made before the retry loop ==");
            String good = payKeyBeforeLoop(url, link, goodOrder, 4200);
            System.out.println("client's answer for " + goodOrder + ": " + good);
            if (link.lostAnswers() != 1) throw new IllegalStateException("the link lost " + link.lostAnswers() + " answers, not 1");
            if (!args_contains(args, "--without-anti-pattern")) {
                System.out.println("== ANTI-PATTERN: key made inside the retry loop ==");
                String bad = payKeyInsideLoop(url, link, badOrder, 4200);
                System.out.println("client's answer for " + badOrder + ": " + bad);
            }
            try (Connection db = DriverManager.getConnection(url); PreparedStatement ps = db.prepareStatement(
                    "SELECT order_no, count(*), sum(amount_cents) FROM card_charges WHERE order_no IN (?, ?) GROUP BY 1 ORDER BY 1")) {
                ps.setString(1, goodOrder);
                ps.setString(2, badOrder);
                ResultSet rs = ps.executeQuery();
                while (rs.next()) {
                    System.out.printf("card charges for %s: %d (%s)%s%n", rs.getString(1), rs.getInt(2), money(rs.getInt(3)),
                            rs.getInt(2) > 1 ? "  <- charged twice" : "");
                }
            }
        }
    }

    static boolean args_contains(String[] args, String flag) {
        for (String a : args) if (a.equals(flag)) return true;
        return false;
    }

    static String env(String name, String dflt) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? dflt : v;
    }

    // ---- the network between the program and PostgreSQL ----------------------

    /** A TCP relay that, when told to, loses the server's answer to the next COMMIT. */
    static final class FlakyLink implements AutoCloseable {
        private final ServerSocketChannel listener;
        private final SocketAddress upstream;
        private final AtomicBoolean loseNextCommitAnswer = new AtomicBoolean();
        private int lost;

        FlakyLink(SocketAddress upstream) throws IOException {
            this.upstream = upstream;
            this.listener = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0));
            Thread t = new Thread(this::acceptLoop, "flaky-link");
            t.setDaemon(true);
            t.start();
        }

        int port() throws IOException {
            return ((InetSocketAddress) listener.getLocalAddress()).getPort();
        }

        void loseAnswerToNextCommit() {
            loseNextCommitAnswer.set(true);
        }

        synchronized int lostAnswers() {
            return lost;
        }

        private void acceptLoop() {
            while (listener.isOpen()) {
                try {
                    SocketChannel client = listener.accept();
                    SocketChannel server = upstream instanceof UnixDomainSocketAddress
                            ? SocketChannel.open(StandardProtocolFamily.UNIX) : SocketChannel.open();
                    server.connect(upstream);
                    // Set by the client-to-server pump when it forwarded a COMMIT
                    // that is to be lost; read by the server-to-client pump.
                    AtomicBoolean dropAnswer = new AtomicBoolean();
                    pump(client, server, dropAnswer, true);
                    pump(server, client, dropAnswer, false);
                } catch (IOException e) {
                    return; // closed
                }
            }
        }

        // Channel reads and writes, not streams: the streams of one blocking
        // channel share a lock, so a blocked read would stall the other direction.
        private void pump(SocketChannel from, SocketChannel to, AtomicBoolean dropAnswer, boolean clientToServer) {
            Thread t = new Thread(() -> {
                ByteBuffer buf = ByteBuffer.allocate(64 * 1024);
                try {
                    while (from.read(buf) >= 0) {
                        buf.flip();
                        if (clientToServer && loseNextCommitAnswer.get() && contains(buf, "COMMIT")) {
                            loseNextCommitAnswer.set(false);
                            dropAnswer.set(true);
                        } else if (!clientToServer && dropAnswer.get()) {
                            // The server has committed and answered; the answer goes nowhere.
                            synchronized (this) { lost++; }
                            from.close();
                            to.close();
                            return;
                        }
                        while (buf.hasRemaining()) to.write(buf);
                        buf.clear();
                    }
                } catch (IOException e) {
                    // one side closed
                }
                try { from.close(); to.close(); } catch (IOException ignored) { }
            }, clientToServer ? "link-c2s" : "link-s2c");
            t.setDaemon(true);
            t.start();
        }

        private static boolean contains(ByteBuffer buf, String text) {
            String s = new String(buf.array(), buf.position(), buf.remaining(), StandardCharsets.ISO_8859_1);
            return s.contains(text);
        }

        @Override
        public void close() throws IOException {
            listener.close();
        }
    }
}
