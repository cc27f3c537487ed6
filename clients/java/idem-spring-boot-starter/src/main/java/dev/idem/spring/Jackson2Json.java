package dev.idem.spring;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.MapperFeature;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import java.lang.reflect.Type;

/** Jackson 2 (com.fasterxml), Boot 3's ObjectMapper. */
final class Jackson2Json implements IdemJson {
    private final ObjectMapper mapper;
    private final ObjectMapper canonical;

    @SuppressWarnings("deprecation") // MapperFeature on a copy: the application's mapper stays as it is
    Jackson2Json(ObjectMapper mapper) {
        this.mapper = mapper;
        this.canonical = mapper.copy()
                .configure(MapperFeature.SORT_PROPERTIES_ALPHABETICALLY, true)
                .configure(SerializationFeature.ORDER_MAP_ENTRIES_BY_KEYS, true)
                .configure(SerializationFeature.INDENT_OUTPUT, false);
    }

    @Override
    public String write(Object value) {
        try {
            return mapper.writeValueAsString(value);
        } catch (JsonProcessingException e) {
            throw new IllegalStateException("cannot store the result as JSON: " + e.getOriginalMessage(), e);
        }
    }

    @Override
    public Object read(String json, Type type) {
        try {
            return mapper.readValue(json, mapper.getTypeFactory().constructType(type));
        } catch (JsonProcessingException e) {
            throw new IllegalStateException("cannot read the stored result as " + type.getTypeName() + ": " + e.getOriginalMessage(), e);
        }
    }

    @Override
    public String canonical(Object[] arguments) {
        try {
            return canonical.writeValueAsString(arguments);
        } catch (JsonProcessingException e) {
            throw new IllegalStateException("cannot fingerprint the arguments as JSON (give @Idempotent a fingerprint expression): "
                    + e.getOriginalMessage(), e);
        }
    }
}
