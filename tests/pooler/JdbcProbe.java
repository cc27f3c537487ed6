// JDBC (pgjdbc) behind PgBouncer in transaction mode, for
// tests/scenarios/clients.sh pgbouncer: two clients on one server session
// (pool_size 1).
//
//   java -cp .:/usr/share/java/postgresql.jar JdbcProbe URL repeat|commit
//
// repeat: each client runs its own PreparedStatement 7 times. pgjdbc turns
//   a statement into a named server-side one ("S_1", "S_2", ... counted per
//   connection) at its prepareThreshold-th execution (5 by default), so both
//   clients name theirs "S_1" on the same server session.
// commit: each client runs one statement with autocommit off and commits.
//   Unless prepareThreshold is 0, pgjdbc sends its COMMIT as a named
//   statement, from the first commit() of a connection on.
// Prints the two connections' server sessions and each client's SQLSTATEs.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;

public class JdbcProbe {
    static String run(Connection db, String who, int n) {
        List<String> states = new ArrayList<>();
        try (PreparedStatement ps = db.prepareStatement("SELECT 'statement of client " + who + ": ' || ?")) {
            for (int i = 0; i < n; i++) {
                ps.setString(1, Integer.toString(i));
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    states.add("00000");
                } catch (SQLException e) {
                    states.add(e.getSQLState());
                }
            }
        } catch (SQLException e) {
            states.add(e.getSQLState());
        }
        return String.join(",", states);
    }

    static int pid(Connection db) throws SQLException {
        try (ResultSet rs = db.createStatement().executeQuery("SELECT pg_backend_pid()")) {
            rs.next();
            return rs.getInt(1);
        }
    }

    static String commitOnce(Connection db, String who) {
        try {
            db.setAutoCommit(false);
            try (PreparedStatement ps = db.prepareStatement("SELECT 'statement of client " + who + "'")) {
                ps.executeQuery().close();
            }
            db.commit();
            return "00000";
        } catch (SQLException e) {
            return e.getSQLState();
        }
    }

    public static void main(String[] args) throws Exception {
        try (Connection a = DriverManager.getConnection(args[0]); Connection b = DriverManager.getConnection(args[0])) {
            System.out.println("driver " + a.getMetaData().getDriverVersion());
            System.out.println("pids " + pid(a) + " " + pid(b));
            if (args[1].equals("repeat")) {
                System.out.println("A " + run(a, "A", 7));
                System.out.println("B " + run(b, "B", 7));
            } else {
                System.out.println("A " + commitOnce(a, "A"));
                System.out.println("B " + commitOnce(b, "B"));
            }
        }
    }
}
