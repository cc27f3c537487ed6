package dev.idem.spring;

import com.fasterxml.jackson.databind.ObjectMapper;
import javax.sql.DataSource;
import org.springframework.aop.Advisor;
import org.springframework.aop.support.DefaultPointcutAdvisor;
import org.springframework.aop.support.annotation.AnnotationMatchingPointcut;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.beans.factory.config.BeanDefinition;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Role;
import org.springframework.core.Ordered;
import org.springframework.transaction.support.TransactionSynchronizationManager;
import org.springframework.util.function.SingletonSupplier;

/**
 * Registers the advice of {@link Idempotent}. Its advisor has the
 * transaction advisor's order (lowest precedence) and is defined after it
 * (this configuration comes after Boot's transaction configuration, and an
 * application's own @EnableTransactionManagement comes before every
 * auto-configuration), so on a method that carries both annotations the
 * claim runs inside the transaction. The DataSource and the ObjectMapper are
 * looked up at the first call: advisors are made before other beans.
 */
@AutoConfiguration(afterName = {
        "org.springframework.boot.autoconfigure.transaction.TransactionAutoConfiguration", // Boot 3
        "org.springframework.boot.transaction.autoconfigure.TransactionAutoConfiguration", // Boot 4
        "org.springframework.boot.autoconfigure.jdbc.DataSourceAutoConfiguration",
        "org.springframework.boot.jdbc.autoconfigure.DataSourceAutoConfiguration",
        "org.springframework.boot.autoconfigure.jackson.JacksonAutoConfiguration",
        "org.springframework.boot.jackson.autoconfigure.JacksonAutoConfiguration"})
@ConditionalOnClass({DataSource.class, TransactionSynchronizationManager.class, ObjectMapper.class})
@EnableConfigurationProperties(IdemProperties.class)
@Role(BeanDefinition.ROLE_INFRASTRUCTURE)
public class IdemAutoConfiguration {

    @Bean
    @Role(BeanDefinition.ROLE_INFRASTRUCTURE)
    static Advisor idemIdempotentAdvisor(ObjectProvider<DataSource> dataSource, ObjectProvider<ObjectMapper> objectMapper,
                                         ObjectProvider<IdemProperties> properties) {
        IdempotentInterceptor interceptor = new IdempotentInterceptor(
                SingletonSupplier.of(() -> dataSource.getObject()),
                SingletonSupplier.of(() -> new Jackson2Json(objectMapper.getIfAvailable(ObjectMapper::new))),
                SingletonSupplier.of(() -> properties.getIfAvailable(IdemProperties::new)));
        DefaultPointcutAdvisor advisor = new DefaultPointcutAdvisor(
                new AnnotationMatchingPointcut(null, Idempotent.class, true), interceptor);
        advisor.setOrder(Ordered.LOWEST_PRECEDENCE);
        return advisor;
    }
}
