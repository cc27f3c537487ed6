package dev.idem.spring;

import java.lang.reflect.Type;

/** How results are stored and read back, and arguments fingerprinted: the application's JSON mapper. */
interface IdemJson {
    String write(Object value);

    Object read(String json, Type type);

    /** Canonical JSON of the arguments (properties and map keys sorted). */
    String canonical(Object[] arguments);
}
