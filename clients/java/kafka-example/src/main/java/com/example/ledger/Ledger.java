package com.example.ledger;

import dev.idem.spring.Idempotent;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Service;
import org.springframework.transaction.annotation.Transactional;

/** A payment event booked once: the event's id claimed in the transaction that books it. */
@Service
public class Ledger {
    /** The event, as the producer writes it: "eventId account amountCents". */
    public record Payment(String eventId, String account, long amountCents) {
        static Payment parse(String value) {
            String[] f = value.split(" ");
            return new Payment(f[0], f[1], Long.parseLong(f[2]));
        }
    }

    private final JdbcTemplate jdbc;

    public Ledger(JdbcTemplate jdbc) { this.jdbc = jdbc; }

    @Transactional // joins the batch's transaction when there is one
    @Idempotent(bizType = "ledger.payment", key = "#p.eventId()")
    public void book(Payment p) {
        jdbc.update("INSERT INTO ledger_entries (event_id, account, amount_cents) VALUES (?, ?, ?)",
                p.eventId(), p.account(), p.amountCents());
    }
}
