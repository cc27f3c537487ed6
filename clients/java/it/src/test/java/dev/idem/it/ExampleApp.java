package dev.idem.it;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/** An application's jar (the example's, the conformance server's), started as users start it: java -jar. */
final class ExampleApp implements AutoCloseable {
    private static final Pattern STARTED = Pattern.compile("Tomcat started on port\\D*(\\d+)");
    private final Process process;
    private final Path log;
    private final int port;

    ExampleApp(String jdbcUrl, Path log, String... extra) throws Exception {
        this(System.getProperty("idem.it.jar"), List.of("--spring.datasource.url=" + jdbcUrl, "--example.test-hooks=true"), log, extra);
    }

    /** A web application's jar, with these arguments. */
    ExampleApp(String jar, List<String> arguments, Path log, String... extra) throws Exception {
        this(jar, STARTED, arguments, log, extra);
    }

    /** Any Spring Boot application's jar: started once it prints a line matching started (a port in its group 1, if it has one). */
    ExampleApp(String jar, Pattern started, List<String> arguments, Path log, String... extra) throws Exception {
        String java = ProcessHandle.current().info().command().orElse("java");
        // C1 only and the serial collector: a faster start on a busy 2-core
        // test machine (seconds, not a minute); the application is the same.
        List<String> cmd = new ArrayList<>(List.of(java, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                "-jar", jar, "--server.port=0"));
        cmd.addAll(arguments);
        cmd.addAll(List.of(extra));
        this.log = log;
        this.process = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile()).start();
        Matcher m = awaitLine(started);
        this.port = m.groupCount() > 0 ? Integer.parseInt(m.group(1)) : -1;
    }

    int port() { return port; }

    /** Waits until the application prints a line matching the pattern (it announces its states), or fails if it exits. */
    Matcher awaitLine(Pattern pattern) throws Exception {
        // Only against a hang, not a verdict: a loaded machine has taken 133 s to start the
        // application, and 648 s under nice 19 on 2 cores at a load of 60 to 100.
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(1800);
        while (true) {
            for (String line : Files.readAllLines(log)) {
                Matcher m = pattern.matcher(line);
                if (m.find()) return m;
            }
            if (!process.isAlive()) {
                throw new AssertionError("the application exited (" + process.exitValue() + ") before printing "
                        + pattern + "; its output:\n" + Files.readString(log));
            }
            if (System.nanoTime() > deadline) {
                throw new AssertionError("no line matching " + pattern + " in 1800 s; output:\n" + Files.readString(log));
            }
            Thread.sleep(50);
        }
    }

    /** SIGKILL: no shutdown hook, no rollback sent, the sockets just close. */
    void kill() throws InterruptedException {
        process.destroyForcibly();
        process.waitFor();
    }

    @Override
    public void close() throws Exception {
        if (process.isAlive()) {
            process.destroy();
            if (!process.waitFor(30, TimeUnit.SECONDS)) kill();
        }
    }

    static Path logFile(String name) throws IOException {
        Path dir = Path.of("target", "app-logs");
        Files.createDirectories(dir);
        return dir.resolve(name + ".log");
    }
}
