/*
 * redis_txn: the pgbench-like driver of variants B3 and B0c (bench/run.sh).
 *
 * pgbench cannot talk to Redis (\shell / \setshell fork a process per
 * transaction, which would charge Redis a fork+exec it does not cost), so
 * this driver does what pgbench -M prepared does for B0 -- prepared BEGIN,
 * INSERT, END, one round trip each, one connection per client thread -- and,
 * in mode b3, first one SET <key> 1 NX EX 86400 round trip to redis-server
 * over its unix socket. Mode b0 is the same loop without Redis: the B3/B0c
 * ratio compares like with like, and B0c/B0 shows how close this driver is
 * to pgbench.
 *
 *   redis_txn MODE CONNINFO REDIS_SOCKET CLIENTS SECONDS RUN
 *
 * Prints one line: txns=N seconds=S tps=T lat_avg_ms=L failed=F dup=D
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <libpq-fe.h>

static const char *mode, *conninfo, *redis_path;
static int nclients, seconds;
static long run_id;
static pthread_barrier_t start_barrier;

typedef struct {
    int id;
    long txns, failed, dup;
    double lat_sum;
    int error;
} Client;

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

static int ok(PGconn *c, PGresult *r, const char *what) {
    ExecStatusType s = PQresultStatus(r);
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
        fprintf(stderr, "%s: %s", what, PQerrorMessage(c));
        PQclear(r);
        return 0;
    }
    PQclear(r);
    return 1;
}

static void *client_main(void *arg) {
    Client *cl = arg;
    int b3 = strcmp(mode, "b3") == 0;
    PGconn *c = PQconnectdb(conninfo);
    int rfd = -1;
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "connect: %s", PQerrorMessage(c));
        cl->error = 1;
    } else if (!ok(c, PQprepare(c, "b", "BEGIN", 0, NULL), "prepare") ||
               !ok(c, PQprepare(c, "i", "INSERT INTO orders (key, amount) VALUES (md5($1::text), 1)", 0, NULL), "prepare") ||
               !ok(c, PQprepare(c, "e", "END", 0, NULL), "prepare")) {
        cl->error = 1;
    } else if (b3 && (rfd = redis_connect()) < 0) {
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
        if (b3) {
            int s = redis_set_nx(rfd, key);
            if (s < 0) { cl->error = 1; break; }
            if (s == 0) { cl->dup++; continue; }
        }
        const char *params[1] = {kid_s};
        if (!ok(c, PQexecPrepared(c, "b", 0, NULL, NULL, NULL, 0), "BEGIN") ||
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

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s b0|b3 CONNINFO REDIS_SOCKET CLIENTS SECONDS RUN\n", argv[0]);
        return 2;
    }
    mode = argv[1];
    conninfo = argv[2];
    redis_path = argv[3];
    nclients = atoi(argv[4]);
    seconds = atoi(argv[5]);
    run_id = atol(argv[6]);
    if (strcmp(mode, "b0") && strcmp(mode, "b3")) { fprintf(stderr, "mode must be b0 or b3\n"); return 2; }
    if (nclients < 1 || nclients > 999 || seconds < 1) { fprintf(stderr, "bad clients/seconds\n"); return 2; }

    Client *cl = calloc(nclients, sizeof *cl);
    pthread_t *th = calloc(nclients, sizeof *th);
    pthread_barrier_init(&start_barrier, NULL, nclients + 1);
    for (int i = 0; i < nclients; i++) {
        cl[i].id = i;
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    pthread_barrier_wait(&start_barrier);
    double t0 = now_s();
    long txns = 0, failed = 0, dup = 0;
    double lat = 0;
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
