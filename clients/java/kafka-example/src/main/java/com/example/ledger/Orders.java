package com.example.ledger;

import java.util.List;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Service;
import org.springframework.transaction.annotation.Transactional;

/**
 * Order events applied with idem_transition, in one transaction: applied
 * (and then the events parked for this order that now fit), already or
 * stale (a redelivery, an old event: dropped), premature (it overtook the
 * state it follows: parked, applied when that state arrives). Never
 * blocking the partition, never applied twice.
 */
@Service
public class Orders {
    private final JdbcTemplate jdbc;

    public Orders(JdbcTemplate jdbc) { this.jdbc = jdbc; }

    @Transactional
    public String apply(String orderId, String status) {
        // One event of an order at a time (consumers of other partitions wait
        // here): a premature event parked now is seen by the transaction that
        // applies the state it follows.
        jdbc.queryForList("SELECT 1 FROM orders WHERE id = ? FOR UPDATE", orderId);
        String outcome = transition(orderId, status);
        if ("premature".equals(outcome)) {
            jdbc.update("INSERT INTO parked_order_events (order_id, status) VALUES (?, ?)", orderId, status);
            return outcome;
        }
        if ("applied".equals(outcome)) {
            boolean moved = true;
            while (moved) { // each parked event that fits now, in the machine's order
                moved = false;
                List<String> parked = jdbc.queryForList(
                        "DELETE FROM parked_order_events WHERE order_id = ? RETURNING status", String.class, orderId);
                for (String p : parked) {
                    String o = transition(orderId, p);
                    if ("applied".equals(o)) moved = true;
                    if ("premature".equals(o)) jdbc.update("INSERT INTO parked_order_events (order_id, status) VALUES (?, ?)", orderId, p);
                }
            }
        }
        return outcome;
    }

    private String transition(String orderId, String status) {
        String outcome = jdbc.queryForObject("SELECT idem_transition('orders', 'id', ?, 'status', ?, 'order')",
                String.class, orderId, status);
        if ("applied".equals(outcome)) {
            jdbc.update("INSERT INTO order_history (order_id, status) VALUES (?, ?)", orderId, status);
        }
        return outcome;
    }
}
