package dev.idem.spring.web;

import dev.idem.spring.IdemProperties;
import javax.sql.DataSource;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.beans.factory.SmartInitializingSingleton;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.autoconfigure.condition.ConditionalOnWebApplication;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.transaction.PlatformTransactionManager;
import org.springframework.web.servlet.DispatcherServlet;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerMapping;

/**
 * The Idempotency-Key filter of a Spring MVC application: registered for
 * every path, it acts on handler methods marked {@link IdempotentRequest}
 * only. Ordered last among the filters, so that authentication (Spring
 * Security's filter chain) has run when the tenant hook asks who the caller
 * is. {@code idem.http.enabled=false} leaves it out.
 */
@AutoConfiguration(afterName = {
        "org.springframework.boot.autoconfigure.web.servlet.WebMvcAutoConfiguration", // Boot 3
        "org.springframework.boot.webmvc.autoconfigure.WebMvcAutoConfiguration"}) // Boot 4
@ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.SERVLET)
@ConditionalOnClass({DispatcherServlet.class, DataSource.class, PlatformTransactionManager.class})
@ConditionalOnProperty(prefix = "idem.http", name = "enabled", matchIfMissing = true)
@EnableConfigurationProperties(IdemProperties.class)
public class IdemWebAutoConfiguration {

    @Bean
    IdempotencyKeyFilter idemIdempotencyKeyFilter(IdemProperties properties) {
        return new IdempotencyKeyFilter(properties);
    }

    /** The filter's routes and configuration check, once every bean exists (a misconfiguration stops the start). */
    @Bean
    SmartInitializingSingleton idemIdempotencyKeyFilterInit(IdempotencyKeyFilter filter, ObjectProvider<DataSource> dataSource,
            ObjectProvider<PlatformTransactionManager> transactions, ObjectProvider<IdemTenant> tenant,
            ObjectProvider<RequestMappingHandlerMapping> mappings) {
        return () -> {
            RequestMappingHandlerMapping mapping = mappings.orderedStream()
                    .filter(m -> !m.getHandlerMethods().isEmpty()).findFirst().orElse(null);
            if (mapping == null) return;
            filter.init(dataSource.getIfUnique(), transactions.getIfUnique(), tenant.getIfUnique(), mapping);
        };
    }
}
