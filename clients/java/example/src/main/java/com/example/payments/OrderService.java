package com.example.payments;

import dev.idem.spring.Idempotent;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Service;
import org.springframework.transaction.annotation.Transactional;

/** Orders with JPA, and an event row with JdbcTemplate, in the claim's transaction. */
@Service
public class OrderService {
    public record NewOrder(String sku, int quantity) { }
    public record OrderView(long orderId, String sku, int quantity) { }

    private final ShopOrders orders;
    private final JdbcTemplate jdbc;

    public OrderService(ShopOrders orders, JdbcTemplate jdbc) {
        this.orders = orders;
        this.jdbc = jdbc;
    }

    @Transactional
    @Idempotent(bizType = "orders.create", key = "#requestId", fingerprint = "#order.sku() + ':' + #order.quantity()")
    public OrderView place(String requestId, NewOrder order) {
        ShopOrder saved = orders.save(new ShopOrder(requestId, order.sku(), order.quantity()));
        jdbc.update("INSERT INTO order_events (order_id, kind) VALUES (?, 'created')", saved.getId());
        return new OrderView(saved.getId(), saved.getSku(), saved.getQuantity());
    }
}
