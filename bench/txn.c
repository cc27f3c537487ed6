/*
 * The benchmark's C client, for what pgbench cannot do (bench/README.md):
 *   txn b0|b3|i1 CONNINFO REDIS_SOCKET CLIENTS SECONDS RUN: B0 as pgbench -M
 *     prepared runs it (BEGIN, INSERT, END, a connection per thread), in mode
 *     b3 after a SET key 1 NX EX 86400 round trip to redis-server (pgbench's
 *     \shell would charge Redis a fork per transaction), in mode i1 with
 *     sql/i1.sql's SELECT idem_claim(...) after BEGIN: B3 and I1 from one
 *     client program. Prints "txns=N seconds=S tps=T lat_avg_ms=L failed=F dup=D".
 *   txn kill redis|idem|handwritten first|retry CONNINFO REDIS_SOCKET KEY: the
 *     dedup step and the business INSERT; "first" then stops itself before
 *     COMMIT (SIGSTOP; the harness SIGKILLs it: a kill point without timing),
 *     "retry" commits, or does no work when told duplicate. Prints
 *     "outcome=done|duplicate".
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <libpq-fe.h>

static const char *conninfo, *redis_path;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static int redis_connect(void) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, redis_path, sizeof a.sun_path - 1);
    if (fd < 0 || connect(fd, (struct sockaddr *) &a, sizeof a) != 0) {
        fprintf(stderr, "redis connect %s: %s\n", redis_path, strerror(errno));
        return -1;
    }
    return fd;
}

/* SET key 1 NX EX 86400: 1 if set, 0 if the key existed, -1 on error. */
static int redis_set_nx(int fd, const char *key) {
    char cmd[256], buf[256];
    int n = snprintf(cmd, sizeof cmd,
                     "*6\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$1\r\n1\r\n$2\r\nNX\r\n$2\r\nEX\r\n$5\r\n86400\r\n",
                     strlen(key), key);
    for (int off = 0; off < n;) {
        ssize_t w = write(fd, cmd + off, n - off);
        if (w <= 0) return -1;
        off += w;
    }
    int got = 0;
    for (;;) {
        ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
        if (r <= 0) return -1;
        got += r;
        buf[got] = 0;
        if (strstr(buf, "\r\n")) break;
        if (got >= (int) sizeof buf - 1) return -1;
    }
    if (strncmp(buf, "+OK", 3) == 0) return 1;
    if (strncmp(buf, "$-1", 3) == 0) return 0;
    fprintf(stderr, "redis: unexpected reply %s\n", buf);
    return -1;
}

/* Clears r; 1 when it succeeded, else prints the error. */
static int ok(PGconn *c, PGresult *r, const char *what) {
    ExecStatusType s = PQresultStatus(r);
    int good = s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK;
    if (!good) fprintf(stderr, "%s: %s", what, PQerrorMessage(c));
    PQclear(r);
    return good;
}

/* ---- b0, b3, i1: timed loop ------------------------------------------------ */
static int mode, seconds;   /* mode: 0 b0, 1 b3, 2 i1 */
static long run_id;
static pthread_barrier_t start_barrier;

typedef struct {
    int id, error;
    long txns, failed, dup;
    double lat_sum;
} Client;

static void *client_main(void *arg) {
    Client *cl = arg;
    PGconn *c = PQconnectdb(conninfo);
    int rfd = -1;
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "connect: %s", PQerrorMessage(c));
        cl->error = 1;
    } else if (!ok(c, PQprepare(c, "b", "BEGIN", 0, NULL), "prepare") ||
               !ok(c, PQprepare(c, "i", "INSERT INTO orders (key, amount) VALUES (md5($1::text), 1)", 0, NULL), "prepare") ||
               !ok(c, PQprepare(c, "e", "END", 0, NULL), "prepare") ||
               (mode == 2 && !ok(c, PQprepare(c, "c", "SELECT idem_claim(md5($1::text), 'bench')", 0, NULL), "prepare"))) {
        cl->error = 1;
    } else if (mode == 1 && (rfd = redis_connect()) < 0) {
        cl->error = 1;
    }
    pthread_barrier_wait(&start_barrier);
    if (cl->error) return NULL;
    double t_end = now_s() + seconds;
    for (long n = 1;; n++) {
        double t0 = now_s();
        if (t0 >= t_end) break;
        /* The same unique key scheme as the pgbench scripts (README). */
        int64_t kid = ((int64_t) run_id * 1000 + cl->id) * 10000000000LL + n;
        char kid_s[32], key[40];
        snprintf(kid_s, sizeof kid_s, "%" PRId64, kid);
        snprintf(key, sizeof key, "%016" PRIx64 "%016" PRIx64,
                 splitmix64((uint64_t) kid), splitmix64((uint64_t) kid ^ 0x5bd1e995ULL));
        if (mode == 1) {
            int s = redis_set_nx(rfd, key);
            if (s < 0) { cl->error = 1; break; }
            if (s == 0) { cl->dup++; continue; }
        }
        const char *params[1] = {kid_s};
        if (!ok(c, PQexecPrepared(c, "b", 0, NULL, NULL, NULL, 0), "BEGIN") ||
            (mode == 2 && !ok(c, PQexecPrepared(c, "c", 1, params, NULL, NULL, 0), "idem_claim")) ||
            !ok(c, PQexecPrepared(c, "i", 1, params, NULL, NULL, 0), "INSERT") ||
            !ok(c, PQexecPrepared(c, "e", 0, NULL, NULL, NULL, 0), "END")) {
            cl->failed++;
            cl->error = 1;
            break;
        }
        cl->txns++;
        cl->lat_sum += now_s() - t0;
    }
    if (rfd >= 0) close(rfd);
    PQfinish(c);
    return NULL;
}

static int timed(int nclients) {
    Client *cl = calloc(nclients, sizeof *cl);
    pthread_t *th = calloc(nclients, sizeof *th);
    pthread_barrier_init(&start_barrier, NULL, nclients + 1);
    for (int i = 0; i < nclients; i++) {
        cl[i].id = i;
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    pthread_barrier_wait(&start_barrier);
    double t0 = now_s(), lat = 0;
    long txns = 0, failed = 0, dup = 0;
    int error = 0;
    for (int i = 0; i < nclients; i++) {
        pthread_join(th[i], NULL);
        txns += cl[i].txns;
        failed += cl[i].failed;
        dup += cl[i].dup;
        lat += cl[i].lat_sum;
        error |= cl[i].error;
    }
    double el = now_s() - t0;
    printf("txns=%ld seconds=%.3f tps=%.3f lat_avg_ms=%.4f failed=%ld dup=%ld\n",
           txns, el, txns / el, txns ? lat / txns * 1000 : 0.0, failed, dup);
    return error ? 1 : 0;
}

/* ---- kill: one client of the kills section --------------------------------- */
static PGconn *conn;

static PGresult *run(const char *sql, const char *key) {
    const char *params[1] = {key};
    PGresult *r = PQexecParams(conn, sql, key ? 1 : 0, NULL, key ? params : NULL, NULL, NULL, 0);
    ExecStatusType s = PQresultStatus(r);
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
        fprintf(stderr, "%s: %s", sql, PQerrorMessage(conn));
        exit(2);
    }
    return r;
}

static int kill_client(const char *approach, int first, const char *key) {
    conn = PQconnectdb(conninfo);
    if (PQstatus(conn) != CONNECTION_OK) { fprintf(stderr, "connect: %s", PQerrorMessage(conn)); return 2; }
    int fresh;   /* did the dedup step say "new"? */
    if (strcmp(approach, "redis") == 0) {
        int fd = redis_connect();
        if (fd < 0 || (fresh = redis_set_nx(fd, key)) < 0) return 2;
        close(fd);
        PQclear(run("BEGIN", NULL));
    } else {
        int idem = strcmp(approach, "idem") == 0;
        if (!idem && strcmp(approach, "handwritten")) { fprintf(stderr, "unknown approach %s\n", approach); return 2; }
        PQclear(run("BEGIN", NULL));
        PGresult *r = run(idem ? "SELECT claimed FROM idem_claim($1, 'kills')"
                               : "INSERT INTO hw_dedup (key) VALUES ($1) ON CONFLICT DO NOTHING RETURNING key", key);
        fresh = PQntuples(r) == 1 && (!idem || strcmp(PQgetvalue(r, 0, 0), "t") == 0);
        PQclear(r);
    }
    if (!fresh) {
        if (first) { fprintf(stderr, "first client: the dedup step said duplicate\n"); return 3; }
        PQclear(run("ROLLBACK", NULL));
        printf("outcome=duplicate\n");
        return 0;
    }
    PQclear(run("INSERT INTO orders (key, amount) VALUES ($1, 1)", key));
    if (first) {
        fflush(stdout);
        raise(SIGSTOP);   /* the harness SIGKILLs us here */
    }
    PQclear(run("COMMIT", NULL));
    printf("outcome=done\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 7 && strcmp(argv[1], "kill") == 0) {
        conninfo = argv[4];
        redis_path = argv[5];
        if (strcmp(argv[3], "first") && strcmp(argv[3], "retry")) { fprintf(stderr, "phase: first or retry\n"); return 2; }
        return kill_client(argv[2], strcmp(argv[3], "first") == 0, argv[6]);
    }
    mode = argc < 2 ? -1 : !strcmp(argv[1], "b0") ? 0 : !strcmp(argv[1], "b3") ? 1 : !strcmp(argv[1], "i1") ? 2 : -1;
    if (argc != 7 || mode < 0) {
        fprintf(stderr, "usage: %s b0|b3|i1 CONNINFO REDIS_SOCKET CLIENTS SECONDS RUN\n"
                        "       %s kill redis|idem|handwritten first|retry CONNINFO REDIS_SOCKET KEY\n", argv[0], argv[0]);
        return 2;
    }
    conninfo = argv[2];
    redis_path = argv[3];
    int nclients = atoi(argv[4]);
    seconds = atoi(argv[5]);
    run_id = atol(argv[6]);
    if (nclients < 1 || nclients > 999 || seconds < 1) { fprintf(stderr, "bad clients/seconds\n"); return 2; }
    return timed(nclients);
}
