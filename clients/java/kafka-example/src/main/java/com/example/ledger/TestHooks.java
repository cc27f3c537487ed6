package com.example.ledger;

import java.util.Set;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.stereotype.Component;

/**
 * Not part of the example: what the tests watch. Prints each delivery,
 * and, for the events named in ledger.test.hold-after-commit, stops after
 * the database COMMIT and before the acknowledgement, says so, and waits
 * there for the test to kill the process.
 */
@Component
public class TestHooks {
    private final Set<String> hold;

    public TestHooks(@Value("${ledger.test.hold-after-commit:}") String hold) {
        this.hold = hold.isEmpty() ? Set.of() : Set.of(hold.split(","));
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
