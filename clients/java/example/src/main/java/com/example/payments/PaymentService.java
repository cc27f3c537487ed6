package com.example.payments;

import dev.idem.spring.Idempotent;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Service;
import org.springframework.transaction.annotation.Transactional;

/** Payments with JdbcTemplate: the claim, the charge and the stored receipt in one transaction. */
@Service
public class PaymentService {
    public record PayCommand(String requestId, String accountId, String orderNo, long amountCents) { }
    public record Receipt(long paymentId, String orderNo, long amountCents, String status) { }
    public record RefundCommand(long paymentId, long amountCents) { }
    public record Refund(long refundId, long paymentId, long amountCents) { }

    public static class InsufficientFunds extends RuntimeException {
        InsufficientFunds(String accountId) { super("insufficient funds on " + accountId); }
    }

    private final JdbcTemplate jdbc;

    public PaymentService(JdbcTemplate jdbc) { this.jdbc = jdbc; }

    @Transactional
    @Idempotent(bizType = "payment", key = "#cmd.requestId()")
    public Receipt pay(PayCommand cmd) {
        Long id = jdbc.queryForObject(
                "INSERT INTO payments (request_id, account_id, order_no, amount_cents) VALUES (?, ?, ?, ?) RETURNING id",
                Long.class, cmd.requestId(), cmd.accountId(), cmd.orderNo(), cmd.amountCents());
        int debited = jdbc.update("UPDATE accounts SET balance_cents = balance_cents - ? WHERE id = ? AND balance_cents >= ?",
                cmd.amountCents(), cmd.accountId(), cmd.amountCents());
        if (debited == 0) {
            throw new InsufficientFunds(cmd.accountId()); // rolls back the payment and the claim: a retry runs again
        }
        return new Receipt(id, cmd.orderNo(), cmd.amountCents(), "charged");
    }

    @Transactional // joins the request's transaction, which the Idempotency-Key filter opened
    public Refund refund(RefundCommand cmd) {
        Long id = jdbc.queryForObject("INSERT INTO refunds (payment_id, amount_cents) VALUES (?, ?) RETURNING id",
                Long.class, cmd.paymentId(), cmd.amountCents());
        return new Refund(id, cmd.paymentId(), cmd.amountCents());
    }
}
