package com.example.payments;

import com.example.payments.OrderService.NewOrder;
import com.example.payments.OrderService.OrderView;
import com.example.payments.PaymentService.InsufficientFunds;
import com.example.payments.PaymentService.PayCommand;
import com.example.payments.PaymentService.Receipt;
import com.example.payments.PaymentService.Refund;
import com.example.payments.PaymentService.RefundCommand;
import dev.idem.spring.IdempotencyException;
import dev.idem.spring.IdempotencyInProgressException;
import dev.idem.spring.IdempotencyKeyReusedException;
import dev.idem.spring.web.IdempotentRequest;
import org.springframework.http.HttpStatus;
import org.springframework.http.ProblemDetail;
import org.springframework.http.ResponseEntity;
import org.springframework.web.bind.annotation.ExceptionHandler;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RequestHeader;
import org.springframework.web.bind.annotation.RestController;

@RestController
public class Api {
    private final PaymentService payments;
    private final OrderService orders;

    public Api(PaymentService payments, OrderService orders) {
        this.payments = payments;
        this.orders = orders;
    }

    @PostMapping("/payments")
    public Receipt pay(@RequestBody PayCommand cmd) {
        return payments.pay(cmd); // a retry with the same requestId gets the first receipt
    }

    @PostMapping("/orders")
    public OrderView place(@RequestHeader("Request-Id") String requestId, @RequestBody NewOrder order) {
        return orders.place(requestId, order);
    }

    /**
     * Idempotent by the client's Idempotency-Key header (docs/http.md): the
     * filter claims the key in the request's transaction, this method's
     * writes join it, and the response is stored with them; a retry gets it
     * back with Idempotent-Replayed: true.
     */
    @PostMapping("/refunds")
    @IdempotentRequest(bizType = "refund")
    public ResponseEntity<Refund> refund(@RequestBody RefundCommand cmd) {
        Refund refund = payments.refund(cmd);
        return ResponseEntity.status(HttpStatus.CREATED).header("Location", "/refunds/" + refund.refundId()).body(refund);
    }

    @ExceptionHandler(IdempotencyKeyReusedException.class) // ID001: same key, different request
    public ResponseEntity<ProblemDetail> reused(IdempotencyKeyReusedException e) {
        return problem(HttpStatus.UNPROCESSABLE_ENTITY, e);
    }

    @ExceptionHandler(IdempotencyInProgressException.class) // the first call is still running
    public ResponseEntity<ProblemDetail> inProgress(IdempotencyInProgressException e) {
        return ResponseEntity.status(HttpStatus.CONFLICT).header("Retry-After", "1").body(detail(HttpStatus.CONFLICT, e));
    }

    @ExceptionHandler(InsufficientFunds.class)
    public ResponseEntity<ProblemDetail> insufficientFunds(InsufficientFunds e) {
        return ResponseEntity.status(HttpStatus.PAYMENT_REQUIRED)
                .body(ProblemDetail.forStatusAndDetail(HttpStatus.PAYMENT_REQUIRED, e.getMessage()));
    }

    private static ResponseEntity<ProblemDetail> problem(HttpStatus status, IdempotencyException e) {
        return ResponseEntity.status(status).body(detail(status, e));
    }

    private static ProblemDetail detail(HttpStatus status, IdempotencyException e) {
        ProblemDetail body = ProblemDetail.forStatusAndDetail(status, e.getMessage());
        body.setProperty("sqlstate", e.getSqlState());
        return body;
    }
}
