// The middleware's tests against real servers (tests/scenarios/
// middleware_go.sh sets the environment):
//
//	IDEM_TEST_CHECK_DSN     the test's own connection (direct to the cluster)
//	IDEM_TEST_SERVER_DSNS   "label=dsn|label=dsn": what each run's server pool
//	                        connects to (the cluster's socket, PgBouncer)
//	IDEM_TEST_ROUTERS       default "nethttp chi echo gin"
//	IDEM_TEST_CONFORMANCE   the conformance table (tests/middleware/conformance.json)
//	IDEM_TEST_REQUIRED=1    a missing variable fails instead of skipping
//
// Every wait is for an observed state (a line on a FIFO, pg_locks,
// pg_stat_activity, a server answering), never a sleep that decides.
package main_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	serverBin string
	checkDB   *pgxpool.Pool
	client    = &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport:     &http.Transport{MaxIdleConnsPerHost: 64},
	}
)

func TestMain(m *testing.M) {
	dsn := os.Getenv("IDEM_TEST_CHECK_DSN")
	if dsn == "" {
		if os.Getenv("IDEM_TEST_REQUIRED") == "1" {
			fmt.Println("IDEM_TEST_CHECK_DSN is not set")
			os.Exit(1)
		}
		fmt.Println("skipped: no database (run tests/scenarios/clients.sh middleware_go)")
		os.Exit(0)
	}
	var err error
	if checkDB, err = pgxpool.New(context.Background(), dsn); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "idem-go-test")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	// The server is built with the race detector too.
	serverBin = filepath.Join(dir, "server")
	build := exec.Command("go", "build", "-race", "-o", serverBin, "./server")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Println("building the test server:", err)
		os.Exit(1)
	}
	code := m.Run()
	checkDB.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

// server is one running test server.
type server struct {
	t      *testing.T
	router string
	dsn    string
	base   string
	addr   string
	fifo   string
	cmd    *exec.Cmd
	log    *syncBuffer
}

// syncBuffer: the server's stderr (a race report, a panic), shown when a
// check fails.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func startServer(t *testing.T, router, dsn string) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	fifo := filepath.Join(t.TempDir(), "signal")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, router: router, dsn: dsn, addr: addr, base: "http://" + addr, fifo: fifo}
	s.start()
	t.Cleanup(s.kill)
	return s
}

func (s *server) start() {
	s.t.Helper()
	s.cmd = exec.Command(serverBin, "-router", s.router)
	s.cmd.Env = append(os.Environ(), "IDEM_TEST_DSN="+s.dsn, "IDEM_TEST_ADDR="+s.addr,
		"IDEM_TEST_SIGNAL="+s.fifo, "IDEM_TEST_PROBLEM_BASE="+table.ProblemBase)
	s.log = &syncBuffer{}
	s.cmd.Stderr = s.log
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "listening\n" {
		s.cmd.Wait()
		s.t.Fatalf("the %s server did not start: %q %s", s.router, line, s.log)
	}
	go io.Copy(io.Discard, out)
}

// kill: SIGKILL, as a crash or an OOM kill would end it.
func (s *server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

// TestMiddleware runs, for each router and each connection of the
// server's pool, the conformance table and the concurrency and kill tests.
func TestMiddleware(t *testing.T) {
	loadTable(t)
	routers := strings.Fields(os.Getenv("IDEM_TEST_ROUTERS"))
	if len(routers) == 0 {
		routers = []string{"nethttp", "chi", "echo", "gin"}
	}
	dsns := os.Getenv("IDEM_TEST_SERVER_DSNS")
	if dsns == "" {
		t.Fatal("IDEM_TEST_SERVER_DSNS is not set")
	}
	for _, via := range strings.Split(dsns, "|") {
		label, dsn, _ := strings.Cut(via, "=")
		for _, router := range routers {
			t.Run(router+"/"+label, func(t *testing.T) {
				s := startServer(t, router, dsn)
				t.Run("conformance", func(t *testing.T) { runConformance(t, s) })
				t.Run("concurrent duplicates wait", func(t *testing.T) { concurrentWait(t, s) })
				t.Run("concurrent duplicates without wait", func(t *testing.T) { concurrentNoWait(t, s) })
				t.Run("killed before COMMIT", func(t *testing.T) { killed(t, s, "before_commit") })
				t.Run("killed after COMMIT", func(t *testing.T) { killed(t, s, "after_commit") })
				t.Run("lease taken over after a kill", func(t *testing.T) { leaseTakeover(t, s) })
				t.Run("lease handed back before a large 500 goes out", func(t *testing.T) { leaseLargeAnswer(t, s) })
				t.Run("the handler's savepoints; its Commit refused", func(t *testing.T) { handlerSavepoints(t, s) })
				if strings.Contains(s.log.String(), "WARNING: DATA RACE") || strings.Contains(s.log.String(), "panic:") {
					t.Fatalf("the %s server's log:\n%s", router, s.log)
				}
			})
		}
	}
}

func deadline() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	_ = cancel
	return ctx
}
