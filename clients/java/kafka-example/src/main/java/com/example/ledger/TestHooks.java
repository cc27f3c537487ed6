package com.example.ledger;

import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.context.annotation.Bean;
import org.springframework.core.env.Environment;
import org.springframework.kafka.annotation.KafkaListenerAnnotationBeanPostProcessor.AnnotationEnhancer;
import org.springframework.stereotype.Component;

/**
 * Not part of the example: what the tests watch. Prints each delivery,
 * and, for the events named in ledger.test.hold-after-commit, stops after
 * the database COMMIT and before the acknowledgement, says so, and waits
 * there for the test to kill the process. With ledger.test.suffix, every
 * listener's topics and consumer group carry that suffix: the tests' runs
 * share one broker without meeting.
 */
@Component
public class TestHooks {
    private final Set<String> hold;

    public TestHooks(@Value("${ledger.test.hold-after-commit:}") String hold) {
        this.hold = hold.isEmpty() ? Set.of() : Set.of(hold.split(","));
    }

    @Bean
    static AnnotationEnhancer testSuffix(Environment env) {
        String suffix = env.getProperty("ledger.test.suffix", "");
        return (attributes, element) -> {
            if (suffix.isEmpty()) return attributes;
            Map<String, Object> named = new HashMap<>(attributes);
            named.put("topics", Arrays.stream((String[]) attributes.get("topics")).map(t -> t + suffix).toArray(String[]::new));
            named.put("groupId", attributes.get("groupId") + suffix);
            return named;
        };
    }

    void delivered(String event) {
        if (!hold.isEmpty()) System.out.println("DELIVERED " + event);
    }

    void committed(String event) {
        if (hold.contains(event)) {
            System.out.println("HOLD after-commit " + event);
            System.out.flush();
            try {
                Thread.sleep(Long.MAX_VALUE);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }
}
