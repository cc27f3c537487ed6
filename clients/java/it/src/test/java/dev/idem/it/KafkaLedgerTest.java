package dev.idem.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.regex.Pattern;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.serialization.StringSerializer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * The Kafka example (clients/java/kafka-example) run from its jar against a
 * real broker (Kafka 4.1 in KRaft mode, its own process, started by
 * tests/scenarios/clients.sh java_spring: -Didem.it.kafka=host:port) and the
 * database; verdicts from the business rows. The listener is SIGKILLed
 * after its database COMMIT and before its acknowledgement (at a point the
 * application announces), twice while events keep coming, each time with
 * both listeners (single records and a batch) held there: the broker
 * redelivers, every event is booked once. Order events delivered out
 * of order over two partitions, while a second consumer joins the group
 * and the first is killed (two rebalances): every order ends DONE, every
 * transition applied once. The topics and consumer groups are this run's
 * (their names end in its id: ledger.test.suffix), so that several runs
 * share one broker without meeting.
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class KafkaLedgerTest {
    static final Pattern STARTED = Pattern.compile("Started LedgerApplication");
    static String bootstrap;
    static String jdbcUrl;
    static Connection db;
    static KafkaProducer<String, String> producer;
    static final List<ExampleApp> apps = new ArrayList<>();
    /** The consumer that the first test left running. */
    static ExampleApp running;
    static final String run = UUID.randomUUID().toString().substring(0, 8);

    @BeforeAll
    static void start() throws Exception {
        bootstrap = System.getProperty("idem.it.kafka");
        if (bootstrap == null || bootstrap.isEmpty()) throw new IllegalStateException("-Didem.it.kafka is required (tests/scenarios/clients.sh java_spring)");
        jdbcUrl = TestDatabase.jdbcUrl();
        db = DriverManager.getConnection(jdbcUrl + "&ApplicationName=idem-kafka-it");
        Map<String, Object> config = Map.of("bootstrap.servers", bootstrap);
        // The scenario started the broker while Maven built: wait until it answers (a bound against a hang only).
        long deadline = System.nanoTime() + 600_000_000_000L;
        try (Admin admin = Admin.create(config)) {
            for (String topic : List.of("payments", "payments-batch", "orders")) {
                topic += suffix();
                while (true) {
                    try {
                        admin.createTopics(List.of(new NewTopic(topic, 2, (short) 1))).all().get();
                        break;
                    } catch (ExecutionException e) {
                        if (e.getCause() instanceof TopicExistsException) break;
                        if (!(e.getCause() instanceof org.apache.kafka.common.errors.TimeoutException) || System.nanoTime() > deadline) throw e;
                    }
                }
            }
        }
        producer = new KafkaProducer<>(Map.of("bootstrap.servers", bootstrap, "acks", "all"), new StringSerializer(), new StringSerializer());
        // The application's tables (its schema.sql) exist once it started; the machine is the operator's (README).
        try (PreparedStatement st = db.prepareStatement("SELECT idem_define_machine('order',"
                + " '{\"CREATED\":[\"PAID\",\"CANCELLED\"],\"PAID\":[\"SHIPPED\"],\"SHIPPED\":[\"DONE\"]}')")) {
            st.execute();
        }
    }

    @AfterAll
    static void stop() throws Exception {
        for (ExampleApp app : apps) app.close();
        if (producer != null) producer.close();
        if (db != null) db.close();
    }

    /** A consumer, held after the COMMIT of the events named (comma-separated; "none": none). */
    static ExampleApp ledger(String hold) throws Exception {
        ExampleApp app = new ExampleApp(System.getProperty("idem.it.kafka-jar"), STARTED,
                List.of("--spring.datasource.url=" + jdbcUrl + "&ApplicationName=idem-ledger",
                        "--spring.kafka.bootstrap-servers=" + bootstrap, "--ledger.test.hold-after-commit=" + hold,
                        "--ledger.test.suffix=" + suffix(),
                        // the broker's floor: a killed consumer's partitions go to the next one after 6 s, not 45
                        "--spring.kafka.consumer.properties.session.timeout.ms=6000",
                        "--spring.kafka.consumer.properties.heartbeat.interval.ms=1000"),
                ExampleApp.logFile("ledger-" + (apps.size() + 1)));
        apps.add(app);
        return app;
    }

    static void send(String topic, String key, String value) throws Exception {
        producer.send(new ProducerRecord<>(topic + suffix(), key, value)).get();
    }

    /** What this run's topic and consumer group names end in. */
    static String suffix() { return "-" + run; }

    static long count(String sql, Object... args) throws Exception {
        try (PreparedStatement st = db.prepareStatement(sql)) {
            for (int i = 0; i < args.length; i++) st.setObject(i + 1, args[i]);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    /** Polls until the query counts n (a bound against a hang only: a loaded machine starts an application in a minute). */
    static void awaitCount(long n, String sql, Object... args) throws Exception {
        long deadline = System.nanoTime() + 600_000_000_000L;
        long got;
        while ((got = count(sql, args)) != n) {
            if (System.nanoTime() > deadline) throw new AssertionError("still " + got + ", not " + n + ": " + sql);
            Thread.sleep(100);
        }
    }

    static long deliveries(String event) throws Exception {
        long n = 0;
        for (Path log : Files.newDirectoryStream(Path.of("target", "app-logs"), "ledger-*.log")) {
            n += Files.readAllLines(log).stream().filter(l -> l.equals("DELIVERED " + event)).count();
        }
        return n;
    }

    static String e(int i) { return String.format("e-%s-%03d", run, i); }
    static String b(int i) { return String.format("b-%s-%03d", run, i); }

    /** Events e-0..e-(to-1) from from, single topic; b-… half as many, batch topic. Keys spread them over both partitions. */
    static void produce(int from, int to) throws Exception {
        for (int i = from; i < to; i++) {
            send("payments", "acct-" + (i % 6), e(i) + " acct-" + (i % 6) + " " + (100 + i));
            if (i % 2 == 0) send("payments-batch", "acct-" + (i % 6), b(i / 2) + " acct-" + (i % 6) + " " + (100 + i));
        }
    }

    @Test
    @Order(1) // its first start creates the application's tables
    void killedAfterCommitBeforeAckEveryEventBookedOnce() throws Exception {
        // Each round: 60 more events (the stream goes on while the listener is
        // down or held), a consumer held after the COMMIT of one single record
        // and of one batch at once, killed there (one JVM start per kill).
        String[][] holds = {{e(20), b(15)}, {e(90), b(45)}};
        for (int round = 0; round < holds.length; round++) {
            produce(round * 60, round * 60 + 60);
            ExampleApp app = ledger(String.join(",", holds[round]));
            for (String held : holds[round]) {
                app.awaitLine(Pattern.compile("HOLD after-commit " + Pattern.quote(held)));
                assertEquals(1, count("SELECT count(*) FROM ledger_entries WHERE event_id = ?", held), "committed before the kill");
            }
            app.kill(); // after COMMIT, before the acknowledgement
        }
        running = ledger("none");
        awaitCount(120 + 60, "SELECT count(DISTINCT event_id) FROM ledger_entries WHERE event_id LIKE ? OR event_id LIKE ?",
                "e-" + run + "-%", "b-" + run + "-%");
        assertEquals(180, count("SELECT count(*) FROM ledger_entries WHERE event_id LIKE ? OR event_id LIKE ?",
                "e-" + run + "-%", "b-" + run + "-%"), "each event booked once");
        for (String[] round : holds) {
            for (String held : round) {
                assertTrue(deliveries(held) >= 2, held + " was delivered again after the kill: " + deliveries(held));
            }
        }
    }

    @Test
    @Order(2)
    void outOfOrderEventsAcrossARebalanceEndRight() throws Exception {
        int orders = 40;
        List<String> events = new ArrayList<>();
        for (int i = 0; i < orders; i++) {
            String id = "o-" + run + "-" + i;
            try (PreparedStatement st = db.prepareStatement("INSERT INTO orders (id, status) VALUES (?, 'CREATED')")) {
                st.setString(1, id);
                st.execute();
            }
            for (String s : List.of("PAID", "SHIPPED", "DONE", "PAID")) events.add(id + " " + s); // and a duplicate
        }
        Collections.shuffle(events, new Random(7));
        Random keys = new Random(11);
        ExampleApp first = running != null ? running : ledger("none"); // the last one of the test before, when it ran
        for (int i = 0; i < events.size() / 2; i++) send("orders", "k" + keys.nextInt(1000), events.get(i));
        ExampleApp second = ledger("none"); // joins the group: a rebalance
        for (int i = events.size() / 2; i < events.size(); i++) send("orders", "k" + keys.nextInt(1000), events.get(i));
        first.kill(); // leaves it: another, and its unacknowledged records go to the second
        awaitCount(orders, "SELECT count(*) FROM orders WHERE id LIKE ? AND status = 'DONE'", "o-" + run + "-%");
        assertEquals(3L * orders, count("SELECT count(*) FROM order_history WHERE order_id LIKE ?", "o-" + run + "-%"),
                "PAID, SHIPPED, DONE once per order");
        assertEquals(0, count("SELECT count(*) FROM (SELECT 1 FROM order_history WHERE order_id LIKE ?"
                + " GROUP BY order_id, status HAVING count(*) > 1) d", "o-" + run + "-%"));
        second.close();
    }
}
