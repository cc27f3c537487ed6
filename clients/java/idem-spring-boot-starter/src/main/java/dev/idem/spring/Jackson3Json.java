package dev.idem.spring;

import java.lang.reflect.Type;
import org.springframework.beans.factory.BeanFactory;
import tools.jackson.core.JacksonException;
import tools.jackson.databind.MapperFeature;
import tools.jackson.databind.ObjectMapper;
import tools.jackson.databind.SerializationFeature;

/** Jackson 3 (tools.jackson), Boot 4's JSON mapper. Loaded only when Jackson 3 is on the classpath. */
final class Jackson3Json implements IdemJson {
    private final ObjectMapper mapper;
    private final ObjectMapper canonical;

    Jackson3Json(ObjectMapper mapper) {
        this.mapper = mapper;
        this.canonical = mapper.rebuild()
                .enable(MapperFeature.SORT_PROPERTIES_ALPHABETICALLY)
                .enable(SerializationFeature.ORDER_MAP_ENTRIES_BY_KEYS)
                .disable(SerializationFeature.INDENT_OUTPUT)
                .build();
    }

    /** The application's Jackson 3 mapper, or null when it has none. */
    static IdemJson fromContext(BeanFactory beans) {
        ObjectMapper m = beans.getBeanProvider(ObjectMapper.class).getIfAvailable();
        return m == null ? null : new Jackson3Json(m);
    }

    @Override
    public String write(Object value) {
        try {
            return mapper.writeValueAsString(value);
        } catch (JacksonException e) {
            throw new IllegalStateException("cannot store the result as JSON: " + e.getOriginalMessage(), e);
        }
    }

    @Override
    public Object read(String json, Type type) {
        try {
            return mapper.readValue(json, mapper.getTypeFactory().constructType(type));
        } catch (JacksonException e) {
            throw new IllegalStateException("cannot read the stored result as " + type.getTypeName() + ": " + e.getOriginalMessage(), e);
        }
    }

    @Override
    public String canonical(Object[] arguments) {
        try {
            return canonical.writeValueAsString(arguments);
        } catch (JacksonException e) {
            throw new IllegalStateException("cannot fingerprint the arguments as JSON (give @Idempotent a fingerprint expression): "
                    + e.getOriginalMessage(), e);
        }
    }
}
