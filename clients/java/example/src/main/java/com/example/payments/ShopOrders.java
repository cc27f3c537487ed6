package com.example.payments;

import org.springframework.data.jpa.repository.JpaRepository;

public interface ShopOrders extends JpaRepository<ShopOrder, Long> { }
