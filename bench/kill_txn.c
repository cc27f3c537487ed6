/*
 * kill_txn: one client of the kills section (bench/sections/kills.py), which
 * counts what each dedup approach leaves behind when the client process dies
 * between the dedup step and COMMIT.
 *
 *   kill_txn APPROACH PHASE CONNINFO REDIS_SOCKET KEY
 *
 * APPROACH: redis        SET KEY 1 NX EX 86400 to redis-server, then BEGIN and
 *                        the business INSERT into orders
 *           idem         BEGIN; SELECT claimed FROM idem_claim(KEY, 'kills');
 *                        the business INSERT
 *           handwritten  BEGIN; INSERT INTO hw_dedup (key) VALUES (KEY)
 *                        ON CONFLICT DO NOTHING RETURNING key; the business
 *                        INSERT
 * PHASE:    first        after the dedup step and the business INSERT, the
 *                        process stops itself (raise(SIGSTOP)) before COMMIT:
 *                        the harness sees it stopped (waitpid WUNTRACED) and
 *                        SIGKILLs it. A deterministic kill point, no timing.
 *           retry        a fresh client with the same key: if the dedup step
 *                        says duplicate, it does no business work (as an
 *                        application returns "already done"); else INSERT and
 *                        COMMIT.
 * Prints one line: outcome=done|duplicate (retry) or exits non-zero on an
 * unexpected answer.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <libpq-fe.h>

static PGconn *conn;

static void die(const char *what) {
    fprintf(stderr, "%s: %s", what, conn ? PQerrorMessage(conn) : "\n");
    exit(2);
}

/* Run one statement with KEY as $1; returns the result (caller clears). */
static PGresult *run(const char *sql, const char *key) {
    const char *params[1] = {key};
    PGresult *r = PQexecParams(conn, sql, key ? 1 : 0, NULL, key ? params : NULL, NULL, NULL, 0);
    ExecStatusType s = PQresultStatus(r);
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) die(sql);
    return r;
}

static void exec_ok(const char *sql, const char *key) { PQclear(run(sql, key)); }

/* SET key 1 NX EX 86400: 1 if set, 0 if the key existed. */
static int redis_set_nx(const char *path, const char *key) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    if (fd < 0 || connect(fd, (struct sockaddr *) &a, sizeof a) != 0) {
        fprintf(stderr, "redis connect %s: %s\n", path, strerror(errno));
        exit(2);
    }
    char cmd[512], buf[256];
    int n = snprintf(cmd, sizeof cmd,
                     "*6\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$1\r\n1\r\n$2\r\nNX\r\n$2\r\nEX\r\n$5\r\n86400\r\n",
                     strlen(key), key);
    if (write(fd, cmd, n) != n) { fprintf(stderr, "redis write\n"); exit(2); }
    int got = 0;
    for (;;) {
        ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
        if (r <= 0) { fprintf(stderr, "redis read\n"); exit(2); }
        got += r;
        buf[got] = 0;
        if (strstr(buf, "\r\n")) break;
    }
    close(fd);
    if (strncmp(buf, "+OK", 3) == 0) return 1;
    if (strncmp(buf, "$-1", 3) == 0) return 0;
    fprintf(stderr, "redis: unexpected reply %s\n", buf);
    exit(2);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s redis|idem|handwritten first|retry CONNINFO REDIS_SOCKET KEY\n", argv[0]);
        return 2;
    }
    const char *approach = argv[1], *phase = argv[2], *key = argv[5];
    int first = strcmp(phase, "first") == 0;
    if (!first && strcmp(phase, "retry")) { fprintf(stderr, "phase must be first or retry\n"); return 2; }
    conn = PQconnectdb(argv[3]);
    if (PQstatus(conn) != CONNECTION_OK) die("connect");

    int fresh;   /* did the dedup step say "new"? */
    if (strcmp(approach, "redis") == 0) {
        fresh = redis_set_nx(argv[4], key);
        exec_ok("BEGIN", NULL);
    } else if (strcmp(approach, "idem") == 0) {
        exec_ok("BEGIN", NULL);
        PGresult *r = run("SELECT claimed FROM idem_claim($1, 'kills')", key);
        fresh = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
        PQclear(r);
    } else if (strcmp(approach, "handwritten") == 0) {
        exec_ok("BEGIN", NULL);
        PGresult *r = run("INSERT INTO hw_dedup (key) VALUES ($1) ON CONFLICT DO NOTHING RETURNING key", key);
        fresh = PQntuples(r) == 1;
        PQclear(r);
    } else {
        fprintf(stderr, "unknown approach %s\n", approach);
        return 2;
    }
    if (!fresh) {
        if (first) { fprintf(stderr, "first client: the dedup step said duplicate\n"); return 3; }
        exec_ok("ROLLBACK", NULL);
        printf("outcome=duplicate\n");
        PQfinish(conn);
        return 0;
    }
    exec_ok("INSERT INTO orders (key, amount) VALUES ($1, 1)", key);
    if (first) {
        fflush(stdout);
        raise(SIGSTOP);   /* the harness SIGKILLs us here */
    }
    exec_ok("COMMIT", NULL);
    printf("outcome=done\n");
    PQfinish(conn);
    return 0;
}
