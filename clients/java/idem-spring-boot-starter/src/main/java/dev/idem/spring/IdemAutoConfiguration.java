package dev.idem.spring;

import com.fasterxml.jackson.databind.ObjectMapper;
import javax.sql.DataSource;
import org.apache.commons.logging.Log;
import org.apache.commons.logging.LogFactory;
import org.springframework.aop.Advisor;
import org.springframework.aop.support.DefaultPointcutAdvisor;
import org.springframework.aop.support.annotation.AnnotationMatchingPointcut;
import org.springframework.beans.factory.BeanFactory;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.beans.factory.config.BeanDefinition;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Role;
import org.springframework.core.Ordered;
import org.springframework.transaction.support.TransactionSynchronizationManager;
import org.springframework.util.ClassUtils;
import org.springframework.util.function.SingletonSupplier;

/**
 * Registers the advice of {@link Idempotent}. Its advisor has the
 * transaction advisor's order (lowest precedence) and is defined after it
 * (this configuration comes after Boot's transaction configuration, and an
 * application's own @EnableTransactionManagement comes before every
 * auto-configuration), so on a method that carries both annotations the
 * claim runs inside the transaction. The DataSource and the JSON mapper are
 * looked up at the first call: advisors are made before other beans.
 */
@AutoConfiguration(afterName = {
        "org.springframework.boot.autoconfigure.transaction.TransactionAutoConfiguration", // Boot 3
        "org.springframework.boot.transaction.autoconfigure.TransactionAutoConfiguration", // Boot 4
        "org.springframework.boot.autoconfigure.jdbc.DataSourceAutoConfiguration",
        "org.springframework.boot.jdbc.autoconfigure.DataSourceAutoConfiguration",
        "org.springframework.boot.autoconfigure.jackson.JacksonAutoConfiguration",
        "org.springframework.boot.jackson.autoconfigure.JacksonAutoConfiguration"})
@ConditionalOnClass({DataSource.class, TransactionSynchronizationManager.class})
@EnableConfigurationProperties(IdemProperties.class)
@Role(BeanDefinition.ROLE_INFRASTRUCTURE)
public class IdemAutoConfiguration {

    @Bean
    @Role(BeanDefinition.ROLE_INFRASTRUCTURE)
    static Advisor idemIdempotentAdvisor(ObjectProvider<DataSource> dataSource, BeanFactory beans,
                                         ObjectProvider<IdemProperties> properties) {
        IdempotentInterceptor interceptor = new IdempotentInterceptor(
                SingletonSupplier.of(() -> dataSource.getObject()),
                SingletonSupplier.of(() -> json(beans)),
                SingletonSupplier.of(() -> properties.getIfAvailable(IdemProperties::new)));
        DefaultPointcutAdvisor advisor = new DefaultPointcutAdvisor(
                new AnnotationMatchingPointcut(null, Idempotent.class, true), interceptor);
        advisor.setOrder(Ordered.LOWEST_PRECEDENCE);
        return advisor;
    }

    private static final boolean JACKSON_3 = ClassUtils.isPresent("tools.jackson.databind.ObjectMapper",
            IdemAutoConfiguration.class.getClassLoader());

    /** The application's mapper: Jackson 3's (Boot 4) if it has one, else Jackson 2's (Boot 3), else a default one. */
    static IdemJson json(BeanFactory beans) {
        if (JACKSON_3) {
            IdemJson j = Jackson3Json.fromContext(beans);
            if (j != null) {
                LOG.info("@Idempotent results as JSON through the application's Jackson 3 ObjectMapper");
                return j;
            }
        }
        ObjectMapper mapper = beans.getBeanProvider(ObjectMapper.class).getIfAvailable();
        LOG.info("@Idempotent results as JSON through " + (mapper != null ? "the application's" : "a default") + " Jackson 2 ObjectMapper");
        return new Jackson2Json(mapper != null ? mapper : new ObjectMapper());
    }

    private static final Log LOG = LogFactory.getLog(IdemAutoConfiguration.class);
}
