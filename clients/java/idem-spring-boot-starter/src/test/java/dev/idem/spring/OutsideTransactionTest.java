package dev.idem.spring;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import java.util.concurrent.atomic.AtomicInteger;
import javax.sql.DataSource;
import org.junit.jupiter.api.Test;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.jdbc.datasource.DriverManagerDataSource;
import org.springframework.transaction.IllegalTransactionStateException;
import org.springframework.transaction.annotation.EnableTransactionManagement;

/**
 * An @Idempotent method called without a transaction is refused before it
 * runs and before any database access (the DataSource here points nowhere:
 * the refusal needs none). The database behaviour is tested through the
 * example application (clients/java/it).
 */
class OutsideTransactionTest {

    static class Charges {
        private final AtomicInteger runs = new AtomicInteger();

        public int runs() { // through the proxy to the target (a CGLIB proxy's own fields are empty)
            return runs.get();
        }

        @Idempotent(bizType = "payment", key = "#requestId")
        public String charge(String requestId) {
            runs.incrementAndGet();
            return "charged";
        }
    }

    @Configuration
    @EnableTransactionManagement
    static class App {
        @Bean
        DataSource dataSource() {
            return new DriverManagerDataSource("jdbc:postgresql://nowhere.invalid/none");
        }

        @Bean
        Charges charges() {
            return new Charges();
        }
    }

    @Test
    void refusedAtCallTimeWithAClearMessage() {
        new ApplicationContextRunner()
                .withConfiguration(AutoConfigurations.of(IdemAutoConfiguration.class))
                .withUserConfiguration(App.class)
                .run(context -> {
                    Charges charges = context.getBean(Charges.class);
                    assertThatThrownBy(() -> charges.charge("r-1"))
                            .isInstanceOf(IllegalTransactionStateException.class)
                            .hasMessageContaining("@Idempotent method Charges.charge was called outside a transaction")
                            .hasMessageContaining("@Transactional");
                    assertThat(charges.runs()).isZero();
                });
    }
}
