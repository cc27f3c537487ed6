package com.example.ledger;

import com.example.ledger.Ledger.Payment;
import java.util.List;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.support.Acknowledgment;
import org.springframework.stereotype.Component;
import org.springframework.transaction.support.TransactionTemplate;

/**
 * At-least-once consumers: the database work commits first, the offset
 * after it (ack-mode manual-immediate). A crash between the two redelivers
 * the records, and the claim made in the committed transaction turns the
 * redelivery into a no-op.
 */
@Component
public class Listeners {
    private final Ledger ledger;
    private final Orders orders;
    private final TransactionTemplate tx;
    private final TestHooks hooks;

    public Listeners(Ledger ledger, Orders orders, TransactionTemplate tx, TestHooks hooks) {
        this.ledger = ledger;
        this.orders = orders;
        this.tx = tx;
        this.hooks = hooks;
    }

    @KafkaListener(topics = "payments", groupId = "ledger")
    public void payment(ConsumerRecord<String, String> record, Acknowledgment ack) {
        Payment p = Payment.parse(record.value());
        hooks.delivered(p.eventId());
        ledger.book(p);              // claim + entry, committed
        hooks.committed(p.eventId()); // (the tests' kill point)
        ack.acknowledge();           // then the offset
    }

    /** A batch in one transaction: every record's claim and entry commit together, then the batch's offsets. */
    @KafkaListener(topics = "payments-batch", groupId = "ledger-batch", batch = "true")
    public void payments(List<ConsumerRecord<String, String>> records, Acknowledgment ack) {
        List<Payment> batch = records.stream().map(r -> Payment.parse(r.value())).toList();
        batch.forEach(p -> hooks.delivered(p.eventId()));
        tx.executeWithoutResult(status -> batch.forEach(ledger::book));
        batch.forEach(p -> hooks.committed(p.eventId()));
        ack.acknowledge();
    }

    /** "orderId STATUS": may arrive out of order (another partition, a redelivery after a rebalance). */
    @KafkaListener(topics = "orders", groupId = "shipping")
    public void orderEvent(ConsumerRecord<String, String> record, Acknowledgment ack) {
        String[] f = record.value().split(" ");
        hooks.delivered(record.value());
        orders.apply(f[0], f[1]);
        hooks.committed(record.value());
        ack.acknowledge();
    }
}
