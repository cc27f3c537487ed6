package dev.idem.it;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import dev.idem.spring.IdemAutoConfiguration;
import dev.idem.spring.IdemClaim;
import dev.idem.spring.IdempotencyException;
import dev.idem.spring.Idempotent;
import java.util.UUID;
import javax.sql.DataSource;
import org.junit.jupiter.api.Test;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.jdbc.datasource.DataSourceTransactionManager;
import org.springframework.jdbc.datasource.DriverManagerDataSource;
import org.springframework.transaction.IllegalTransactionStateException;
import org.springframework.transaction.annotation.EnableTransactionManagement;
import org.springframework.transaction.annotation.Transactional;
import org.springframework.transaction.support.TransactionTemplate;

/**
 * The starter's rules that the example application does not reach, in
 * process against the real database: a claim whose method threw never
 * commits (a checked exception through @Transactional, an exception the
 * caller caught), a read-only transaction is refused, TransactionTemplate
 * works as @Transactional does. Verdicts from the rows and idem_lookup.
 */
class StarterRulesTest {

    public static class Work {
        private final JdbcTemplate jdbc;

        public Work(JdbcTemplate jdbc) { this.jdbc = jdbc; }

        @Idempotent(bizType = "starter.rules", key = "#key")
        public String insert(String key, boolean fail) throws Exception {
            jdbc.update("INSERT INTO starter_rows (key) VALUES (?)", key);
            if (fail) throw new Exception("a checked failure after the insert");
            return "done " + key;
        }

        /** The claim it was told: "attempt previous-error". */
        @Idempotent(bizType = "starter.retry", key = "#key")
        public String told(String key) {
            IdemClaim claim = IdemClaim.current();
            jdbc.update("INSERT INTO starter_rows (key) VALUES (?)", key);
            return claim.attempt() + " " + claim.previousError();
        }
    }

    public static class Caller {
        private final Work work;

        public Caller(Work work) { this.work = work; }

        @Transactional // by default a checked exception commits
        public String propagatesChecked(String key) throws Exception {
            return work.insert(key, true);
        }

        @Transactional
        public String catchesAndCommits(String key) {
            try {
                return work.insert(key, true);
            } catch (Exception swallowed) {
                return "swallowed";
            }
        }

        @Transactional(readOnly = true)
        public String readOnly(String key) throws Exception {
            return work.insert(key, false);
        }
    }

    @Configuration
    @EnableTransactionManagement
    static class App {
        @Bean
        DataSource dataSource() throws Exception {
            return new DriverManagerDataSource(TestDatabase.jdbcUrl() + "&ApplicationName=idem-it-rules");
        }

        @Bean
        DataSourceTransactionManager transactionManager(DataSource ds) { return new DataSourceTransactionManager(ds); }

        @Bean
        JdbcTemplate jdbcTemplate(DataSource ds) { return new JdbcTemplate(ds); }

        @Bean
        TransactionTemplate transactionTemplate(DataSourceTransactionManager tm) { return new TransactionTemplate(tm); }

        @Bean
        Work work(JdbcTemplate jdbc) { return new Work(jdbc); }

        @Bean
        Caller caller(Work work) { return new Caller(work); }
    }

    private final ApplicationContextRunner runner = new ApplicationContextRunner()
            .withConfiguration(AutoConfigurations.of(IdemAutoConfiguration.class))
            .withUserConfiguration(App.class);

    private static long rows(JdbcTemplate jdbc, String key) {
        return jdbc.queryForObject("SELECT count(*) FROM starter_rows WHERE key = ?", Long.class, key);
    }

    private static String state(JdbcTemplate jdbc, String key) {
        return jdbc.queryForObject("SELECT state FROM idem_lookup(?, 'starter.rules')", String.class, key);
    }

    @Test
    void aClaimWhoseMethodThrewNeverCommits() {
        runner.run(context -> {
            JdbcTemplate jdbc = context.getBean(JdbcTemplate.class);
            jdbc.execute("CREATE TABLE IF NOT EXISTS starter_rows (key text NOT NULL)");
            Caller caller = context.getBean(Caller.class);

            String checked = UUID.randomUUID().toString();
            assertThatThrownBy(() -> caller.propagatesChecked(checked))
                    .isInstanceOf(IdempotencyException.class)
                    .hasMessageContaining("may not commit")
                    .hasRootCauseMessage("a checked failure after the insert");
            assertThat(rows(jdbc, checked)).isZero();
            assertThat(state(jdbc, checked)).isEqualTo("absent");

            String caught = UUID.randomUUID().toString();
            assertThatThrownBy(() -> caller.catchesAndCommits(caught))
                    .isInstanceOf(IdempotencyException.class)
                    .hasMessageContaining("may not commit");
            assertThat(rows(jdbc, caught)).isZero();
            assertThat(state(jdbc, caught)).isEqualTo("absent");

            String readOnly = UUID.randomUUID().toString();
            assertThatThrownBy(() -> caller.readOnly(readOnly))
                    .isInstanceOf(IllegalTransactionStateException.class)
                    .hasMessageContaining("read-only transaction");
            assertThat(rows(jdbc, readOnly)).isZero();
        });
    }

    @Test
    void transactionTemplateClaimsAndReplays() {
        runner.run(context -> {
            JdbcTemplate jdbc = context.getBean(JdbcTemplate.class);
            jdbc.execute("CREATE TABLE IF NOT EXISTS starter_rows (key text NOT NULL)");
            TransactionTemplate tx = context.getBean(TransactionTemplate.class);
            Work work = context.getBean(Work.class);
            String key = UUID.randomUUID().toString();
            String first = tx.execute(s -> call(work, key));
            String second = tx.execute(s -> call(work, key));
            assertThat(first).isEqualTo("done " + key);
            assertThat(second).isEqualTo(first);
            assertThat(rows(jdbc, key)).isEqualTo(1);
            assertThat(state(jdbc, key)).isEqualTo("completed");
        });
    }

    /**
     * Under the type's on_failure 'retry', a key whose claim other code
     * failed runs the method again as attempt 2, told the stored error
     * (IdemClaim.current()); its result is then replayed; a new key is
     * attempt 1 with none; outside the method there is no current claim.
     */
    @Test
    void aRetriedFailureTellsTheMethodItsAttemptAndTheError() {
        runner.run(context -> {
            JdbcTemplate jdbc = context.getBean(JdbcTemplate.class);
            jdbc.execute("CREATE TABLE IF NOT EXISTS starter_rows (key text NOT NULL)");
            jdbc.queryForObject("SELECT idem_configure('starter.retry', NULL, 'retry')::text", String.class);
            TransactionTemplate tx = context.getBean(TransactionTemplate.class);
            Work work = context.getBean(Work.class);
            String failed = UUID.randomUUID().toString();
            tx.execute(s -> {
                jdbc.queryForObject("SELECT claimed FROM idem_claim(?, 'starter.retry')", Boolean.class, failed);
                return jdbc.queryForObject("SELECT idem_fail(?, 'starter.retry', '{\"declined\": \"try later\"}')::text", String.class, failed);
            });
            String retried = tx.execute(s -> work.told(failed));
            assertThat(retried).isEqualTo("2 {\"declined\":\"try later\"}");
            String replayed = tx.execute(s -> work.told(failed));
            assertThat(replayed).isEqualTo(retried);
            assertThat(rows(jdbc, failed)).isEqualTo(1);
            String fresh = UUID.randomUUID().toString();
            String first = tx.execute(s -> work.told(fresh));
            assertThat(first).isEqualTo("1 null");
            assertThat(IdemClaim.current()).isNull();
        });
    }

    private static String call(Work work, String key) {
        try {
            return work.insert(key, false);
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }
}
