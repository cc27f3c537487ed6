// The Spring MVC filter's throughput next to a hand-written handler: run by
// bench/middleware.sh java with Java's source launcher (java Load.java URL
// ...; not a test: it measures, and checks only that every answer was the
// expected one). The server is clients/java/conformance-server's jar
// (its own JVM, warmed up here); this client keeps CONCURRENCY keep-alive
// HTTP/1.1 connections busy, against one route per variant:
//
//   a  the filter (@IdempotentRequest), a new Idempotency-Key per request
//   b  the filter replaying the keys a completed
//   c  hand-written: INSERT INTO bench_dedup ... ON CONFLICT DO NOTHING
//      RETURNING, the business insert, UPDATE bench_dedup SET response,
//      one transaction (what a team writes without idem)
//   d  no idempotency: the business insert in a transaction (the floor)
//
// Rounds interleave the variants (a, c, d, b); it prints each run's
// requests/s, the medians and the ratios.
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

public class Load {
    static HttpClient client;
    static String base;
    static int concurrency;
    static final AtomicLong seq = new AtomicLong();

    public static void main(String[] args) throws Exception {
        base = args[0];
        int rounds = Integer.parseInt(args[1]), requests = Integer.parseInt(args[2]), warmup = Integer.parseInt(args[4]);
        concurrency = Integer.parseInt(args[3]);
        ExecutorService pool = Executors.newFixedThreadPool(concurrency);
        // (its own executor: the workers block in send, on the pool's threads)
        client = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
        List<String> keys = run(pool, "a", warmup, null);
        run(pool, "b", warmup, keys);
        run(pool, "c", warmup, null);
        run(pool, "d", warmup, null);
        Map<String, List<Double>> rps = new HashMap<>();
        for (int r = 1; r <= rounds; r++) {
            List<String> line = new ArrayList<>();
            for (String v : List.of("a", "c", "d", "b")) {
                long t0 = System.nanoTime();
                List<String> used = run(pool, v, requests, keys);
                double got = requests / ((System.nanoTime() - t0) / 1e9);
                if (v.equals("a")) keys = used;
                rps.computeIfAbsent(v, k -> new ArrayList<>()).add(got);
                line.add(String.format("%s %.0f", v, got));
            }
            System.out.println("round " + r + ": " + String.join(", ", line) + " requests/s");
        }
        Map<String, Double> med = new HashMap<>();
        for (Map.Entry<String, List<Double>> e : rps.entrySet()) med.put(e.getKey(), median(e.getValue()));
        System.out.printf("median requests/s (%d rounds x %d requests, %d connections): a %.0f, b %.0f, c %.0f, d %.0f%n",
                rounds, requests, concurrency, med.get("a"), med.get("b"), med.get("c"), med.get("d"));
        System.out.printf("ratios of the medians: a/c %.2f, b/c %.2f, d/c %.2f%n",
                med.get("a") / med.get("c"), med.get("b") / med.get("c"), med.get("d") / med.get("c"));
        // The same round's ratios: other programs' load changes less within a round than between rounds.
        for (String v : List.of("a", "b", "d")) {
            List<Double> rs = new ArrayList<>();
            for (int i = 0; i < rounds; i++) rs.add(rps.get(v).get(i) / rps.get("c").get(i));
            Collections.sort(rs);
            System.out.printf("same-round %s/c: median %.2f, range %.2f-%.2f%n", v, median(rs), rs.get(0), rs.get(rs.size() - 1));
        }
        pool.shutdownNow();
    }

    static double median(List<Double> xs) {
        List<Double> s = new ArrayList<>(xs);
        Collections.sort(s);
        return s.get(s.size() / 2);
    }

    /** n requests of the variant over the connections; the keys it used. */
    static List<String> run(ExecutorService pool, String variant, int n, List<String> replayKeys) throws Exception {
        boolean replay = variant.equals("b");
        String path = "/bench/" + (replay ? "a" : variant);
        String[] used = new String[n];
        AtomicInteger next = new AtomicInteger();
        List<Future<?>> workers = new ArrayList<>();
        for (int w = 0; w < concurrency; w++) {
            workers.add(pool.submit(() -> {
                for (int i; (i = next.getAndIncrement()) < n; ) {
                    String key = replay ? replayKeys.get(i % replayKeys.size()) : "bench-" + seq.incrementAndGet() + "-" + System.nanoTime();
                    used[i] = key;
                    HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(base + path)).header("Content-Type", "application/json")
                            .header("X-Tenant", "bench").POST(HttpRequest.BodyPublishers.ofString("{\"amount\": 42}"));
                    if (!variant.equals("d")) b.header("Idempotency-Key", "\"" + key + "\"");
                    HttpResponse<String> r = client.send(b.build(), HttpResponse.BodyHandlers.ofString());
                    boolean replayed = "true".equals(r.headers().firstValue("Idempotent-Replayed").orElse(null));
                    if (r.statusCode() != 201 || replayed != replay) {
                        throw new IllegalStateException("variant " + variant + ": " + r.statusCode() + ", replayed " + replayed + ": " + r.body());
                    }
                }
                return null;
            }));
        }
        for (Future<?> f : workers) f.get();
        return List.of(used);
    }
}
