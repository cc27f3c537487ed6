package dev.idem.spring.web;

import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * JSON as every idem client reads and writes it, without the application's
 * mapper (Jackson 2 or 3, configured as the application likes): a strict
 * RFC 8259 parser (no NaN, of duplicate names the last counts) and RFC 8785
 * (JCS) output, the fingerprint's canonical form (docs/http.md, "The
 * fingerprint").
 */
public final class Json {
    private Json() { }

    /** JSON null (a Java null is "absent" in a parsed object). */
    public static final Object NULL = new Object() {
        @Override public String toString() { return "null"; }
    };

    /** A number as written: compared and written as the IEEE 754 double it denotes. */
    public record Num(String text) {
        public double value() { return Double.parseDouble(text); }
    }

    /** Parses one JSON text (whitespace around it allowed); IllegalArgumentException if it is not. */
    public static Object parse(String text) {
        Parser p = new Parser(text);
        p.ws();
        Object v = p.value();
        p.ws();
        if (p.i != text.length()) throw p.error("text after the JSON value");
        return v;
    }

    /** RFC 8785: members sorted by UTF-16 code units, no whitespace, numbers as ECMAScript writes doubles. */
    public static String canonical(Object value) {
        StringBuilder b = new StringBuilder();
        write(b, value);
        return b.toString();
    }

    @SuppressWarnings("unchecked")
    static void write(StringBuilder b, Object v) {
        if (v instanceof Map<?, ?> m) {
            // String.compareTo compares UTF-16 code units: JCS's order.
            TreeMap<String, Object> sorted = new TreeMap<>((Map<String, Object>) m);
            b.append('{');
            boolean first = true;
            for (Map.Entry<String, Object> e : sorted.entrySet()) {
                if (!first) b.append(',');
                first = false;
                string(b, e.getKey());
                b.append(':');
                write(b, e.getValue());
            }
            b.append('}');
        } else if (v instanceof List<?> l) {
            b.append('[');
            for (int i = 0; i < l.size(); i++) {
                if (i > 0) b.append(',');
                write(b, l.get(i));
            }
            b.append(']');
        } else if (v instanceof String s) {
            string(b, s);
        } else if (v instanceof Num n) {
            b.append(esNumber(n.value()));
        } else if (v instanceof Number n) {
            b.append(esNumber(n.doubleValue()));
        } else if (v instanceof Boolean bool) {
            b.append(bool ? "true" : "false");
        } else {
            b.append("null");
        }
    }

    /** As JSON.stringify escapes: \" \\ \b \f \n \r \t, other control characters \\u00xx, the rest as it is. */
    static void string(StringBuilder b, String s) {
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\b' -> b.append("\\b");
                case '\f' -> b.append("\\f");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20) {
                        b.append("\\u00").append(Character.forDigit(c >> 4, 16)).append(Character.forDigit(c & 15, 16));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        b.append('"');
    }

    /**
     * ECMAScript's Number::toString (RFC 8785, 3.2.2.3): the shortest digits
     * that read back as the same double (the nearest of them), plain from
     * 1e-6 to 1e21. Infinite: null, as JSON.stringify writes it. (Java 17's
     * Double.toString is not always the shortest.)
     */
    static String esNumber(double x) {
        if (Double.isNaN(x) || Double.isInfinite(x)) return "null";
        if (x == 0) return "0";
        if (x < 0) return "-" + esNumber(-x);
        // An integer below 2^53: its shortest round-trip digits are its own (every integer there is a double)
        if (x < 9007199254740992.0 && x == Math.rint(x)) return Long.toString((long) x);
        BigDecimal exact = new BigDecimal(x);
        BigDecimal d = null;
        for (int p = 1; p <= 17; p++) {
            BigDecimal r = exact.round(new MathContext(p, RoundingMode.HALF_EVEN));
            if (r.doubleValue() == x) {
                d = r;
                break;
            }
        }
        d = d.stripTrailingZeros();
        String digits = d.unscaledValue().toString();
        int k = digits.length();
        int n = k - d.scale(); // the decimal point comes after the first n digits
        if (k <= n && n <= 21) return digits + "0".repeat(n - k);
        if (0 < n && n <= 21) return digits.substring(0, n) + "." + digits.substring(n);
        if (-6 < n && n <= 0) return "0." + "0".repeat(-n) + digits;
        String m = k > 1 ? digits.charAt(0) + "." + digits.substring(1) : digits;
        int e = n - 1;
        return m + "e" + (e < 0 ? "-" : "+") + Math.abs(e);
    }

    private static final class Parser {
        final String s;
        int i;

        Parser(String s) { this.s = s; }

        IllegalArgumentException error(String what) {
            return new IllegalArgumentException("not JSON: " + what + " at " + i);
        }

        void ws() {
            while (i < s.length() && (s.charAt(i) == ' ' || s.charAt(i) == '\t' || s.charAt(i) == '\n' || s.charAt(i) == '\r')) i++;
        }

        Object value() {
            if (i >= s.length()) throw error("end of text");
            char c = s.charAt(i);
            switch (c) {
                case '{': return object();
                case '[': return array();
                case '"': return str();
                case 't': return literal("true", Boolean.TRUE);
                case 'f': return literal("false", Boolean.FALSE);
                case 'n': return literal("null", NULL);
                default:
                    if (c == '-' || (c >= '0' && c <= '9')) return number();
                    throw error("unexpected '" + c + "'");
            }
        }

        Object literal(String word, Object v) {
            if (!s.startsWith(word, i)) throw error("unexpected word");
            i += word.length();
            return v;
        }

        Map<String, Object> object() {
            Map<String, Object> m = new LinkedHashMap<>();
            i++;
            ws();
            if (i < s.length() && s.charAt(i) == '}') {
                i++;
                return m;
            }
            while (true) {
                ws();
                if (i >= s.length() || s.charAt(i) != '"') throw error("a member name expected");
                String name = str();
                ws();
                if (i >= s.length() || s.charAt(i) != ':') throw error("':' expected");
                i++;
                ws();
                m.remove(name); // of duplicate names the last counts
                m.put(name, value());
                ws();
                if (i >= s.length()) throw error("end of text in an object");
                char c = s.charAt(i++);
                if (c == '}') return m;
                if (c != ',') throw error("',' or '}' expected");
            }
        }

        List<Object> array() {
            List<Object> l = new ArrayList<>();
            i++;
            ws();
            if (i < s.length() && s.charAt(i) == ']') {
                i++;
                return l;
            }
            while (true) {
                ws();
                l.add(value());
                ws();
                if (i >= s.length()) throw error("end of text in an array");
                char c = s.charAt(i++);
                if (c == ']') return l;
                if (c != ',') throw error("',' or ']' expected");
            }
        }

        String str() {
            StringBuilder b = new StringBuilder();
            i++;
            while (true) {
                if (i >= s.length()) throw error("unterminated string");
                char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c < 0x20) throw error("a control character in a string");
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                if (i >= s.length()) throw error("unterminated escape");
                char e = s.charAt(i++);
                switch (e) {
                    case '"', '\\', '/' -> b.append(e);
                    case 'b' -> b.append('\b');
                    case 'f' -> b.append('\f');
                    case 'n' -> b.append('\n');
                    case 'r' -> b.append('\r');
                    case 't' -> b.append('\t');
                    case 'u' -> {
                        if (i + 4 > s.length()) throw error("short \\u escape");
                        try {
                            b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        } catch (NumberFormatException x) {
                            throw error("bad \\u escape");
                        }
                        i += 4;
                    }
                    default -> throw error("bad escape");
                }
            }
        }

        Num number() {
            int start = i;
            if (s.charAt(i) == '-') i++;
            if (i < s.length() && s.charAt(i) == '0') {
                i++;
            } else if (!digits()) {
                throw error("a digit expected");
            }
            if (i < s.length() && s.charAt(i) == '.') {
                i++;
                if (!digits()) throw error("a digit expected after '.'");
            }
            if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
                i++;
                if (i < s.length() && (s.charAt(i) == '+' || s.charAt(i) == '-')) i++;
                if (!digits()) throw error("a digit expected in the exponent");
            }
            return new Num(s.substring(start, i));
        }

        boolean digits() {
            int start = i;
            while (i < s.length() && s.charAt(i) >= '0' && s.charAt(i) <= '9') i++;
            return i > start;
        }
    }
}
