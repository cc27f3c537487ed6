package com.example.payments;

import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.stereotype.Component;
import org.springframework.transaction.TransactionExecution;
import org.springframework.transaction.TransactionExecutionListener;
import org.springframework.web.context.request.RequestContextHolder;
import org.springframework.web.context.request.ServletRequestAttributes;

/**
 * Not part of the example: the test's hook (off unless
 * example.test-hooks=true). A request with "X-Test-Hold: after-commit"
 * stops after its transaction committed and before its answer, says so on
 * stdout, and waits there for the test to kill the process.
 */
@Component
@ConditionalOnProperty("example.test-hooks")
class TestHooks implements TransactionExecutionListener {
    @Override
    public void afterCommit(TransactionExecution transaction, Throwable commitFailure) {
        if (commitFailure == null && RequestContextHolder.getRequestAttributes() instanceof ServletRequestAttributes request
                && "after-commit".equals(request.getRequest().getHeader("X-Test-Hold"))) {
            System.out.println("HOLD after-commit " + request.getRequest().getHeader("Request-Id"));
            System.out.flush();
            try {
                Thread.sleep(Long.MAX_VALUE);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }
}
