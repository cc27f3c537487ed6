// The Go middleware's throughput next to a hand-written handler: run by
// bench/middleware.sh go (not a test: it measures, and checks only that
// every answer was the expected one). One process: the server (net/http,
// one pgx pool) on loopback and the load client (CONCURRENCY keep-alive
// connections), the same handler behind four variants:
//
//	a  the middleware, a new Idempotency-Key per request
//	b  the middleware replaying the keys a completed
//	c  hand-written: INSERT INTO bench_dedup ... ON CONFLICT DO NOTHING
//	   RETURNING, the business insert, UPDATE bench_dedup SET response,
//	   one transaction (what a team writes without idem)
//	d  no idempotency: the business insert in a transaction (the floor)
//
// Rounds interleave the variants (a, c, d, b); it prints each run's
// requests/s and the medians and ratios, and the CPU time per request of
// this process (server and load client: the client's share is the same in
// every variant) plus PostgreSQL's (its processes' utime + stime from
// /proc, the processes pg_stat_activity lists), which other programs on
// the machine move less than they move requests/s. -cpuprofile FILE: a
// CPU profile of each measured run in FILE.VARIANT.ROUND.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	idem "github.com/idem-pg/idem/clients/go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	rounds := flag.Int("rounds", 5, "rounds")
	requests := flag.Int("requests", 3000, "requests per run")
	concurrency := flag.Int("concurrency", 8, "connections")
	warmup := flag.Int("warmup", 300, "requests per variant before the rounds")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of each measured run to FILE.VARIANT.ROUND (go tool pprof)")
	flag.Parse()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("BENCH_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	for _, q := range []string{
		"CREATE TABLE IF NOT EXISTS bench_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount int NOT NULL)",
		"CREATE TABLE IF NOT EXISTS bench_dedup (key text PRIMARY KEY, response jsonb)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			log.Fatal(err)
		}
	}
	mw, err := idem.New(idem.Config{Pool: pool, Tenant: func(*http.Request) string { return "bench" }})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /a", mw.Route("bench.create")(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		amount := amountOf(r)
		var id int64
		if err := idem.Tx(r.Context()).QueryRow(r.Context(), "INSERT INTO bench_orders (amount) VALUES ($1) RETURNING id", amount).Scan(&id); err != nil {
			mw.WriteError(w, err)
			return
		}
		created(w, id, amount)
	})))
	mux.HandleFunc("POST /c", func(w http.ResponseWriter, r *http.Request) { handWritten(pool, w, r) })
	mux.HandleFunc("POST /d", func(w http.ResponseWriter, r *http.Request) {
		amount := amountOf(r)
		var id int64
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
			return tx.QueryRow(r.Context(), "INSERT INTO bench_orders (amount) VALUES ($1) RETURNING id", amount).Scan(&id)
		})
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		created(w, id, amount)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go http.Serve(ln, mux)
	base := "http://" + ln.Addr().String()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *concurrency}}
	var seq atomic.Int64
	cpuUs, pgUs := map[string][]float64{}, map[string][]float64{} // pgUs: PostgreSQL's share
	round := 0                                                    // 0: the warm-up
	run := func(variant string, n int, keys []string) (float64, []string) {
		if *cpuProfile != "" && round > 0 {
			startProfile(fmt.Sprintf("%s.%s.%d", *cpuProfile, variant, round))
			defer pprof.StopCPUProfile()
		}
		cpu0 := cpuNow(ctx, pool)
		defer func() {
			total, pg := cpuNow(ctx, pool).since(cpu0)
			cpuUs[variant] = append(cpuUs[variant], total.Seconds()*1e6/float64(n))
			pgUs[variant] = append(pgUs[variant], pg.Seconds()*1e6/float64(n))
		}()
		path, replay := "/"+variant, variant == "b"
		if replay {
			path = "/a"
		}
		used := make([]string, n)
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range *concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
						return
					}
					key := fmt.Sprintf("bench-%012d-%d", seq.Add(1), time.Now().UnixNano())
					if replay {
						key = keys[i%len(keys)]
					}
					used[i] = key
					req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(`{"amount": 42}`))
					req.Header.Set("Content-Type", "application/json")
					if variant != "d" {
						req.Header.Set("Idempotency-Key", strconv.Quote(key))
					}
					resp, err := client.Do(req)
					if err != nil {
						log.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 201 || replay != (resp.Header.Get("Idempotent-Replayed") == "true") {
						log.Fatalf("variant %s: %d, replayed %q", variant, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
					}
				}
			}()
		}
		wg.Wait()
		return float64(n) / time.Since(start).Seconds(), used
	}
	checkpoint := func() {
		if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
			log.Fatal(err)
		}
	}
	_, keys := run("a", *warmup, nil)
	run("b", *warmup, keys)
	run("c", *warmup, nil)
	run("d", *warmup, nil)
	rps := map[string][]float64{}
	clear(cpuUs) // (the warm-up's)
	clear(pgUs)
	for r := 1; r <= *rounds; r++ {
		round = r
		var line []string
		for _, v := range []string{"a", "c", "d", "b"} {
			checkpoint()
			var got float64
			if v == "b" {
				got, _ = run("b", *requests, keys)
			} else if v == "a" {
				got, keys = run("a", *requests, nil)
			} else {
				got, _ = run(v, *requests, nil)
			}
			rps[v] = append(rps[v], got)
			line = append(line, fmt.Sprintf("%s %.0f", v, got))
		}
		fmt.Printf("round %d: %s requests/s\n", r, strings.Join(line, ", "))
	}
	rounds0, rps0 := *rounds, map[string][]float64{}
	for v, xs := range rps {
		rps0[v] = append([]float64(nil), xs...)
	}
	med := map[string]float64{}
	for v, xs := range rps {
		sort.Float64s(xs)
		med[v] = xs[len(xs)/2]
	}
	fmt.Printf("median requests/s (%d rounds x %d requests, %d connections): a %.0f, b %.0f, c %.0f, d %.0f\n",
		*rounds, *requests, *concurrency, med["a"], med["b"], med["c"], med["d"])
	fmt.Printf("ratios of the medians: a/c %.2f, b/c %.2f, d/c %.2f; time per request vs c: a %+.0f us, b %+.0f us\n",
		med["a"]/med["c"], med["b"]/med["c"], med["d"]/med["c"], 1e6/med["a"]-1e6/med["c"], 1e6/med["b"]-1e6/med["c"])
	// The same round's ratios: the load other programs put on the machine
	// changes less within a round than between rounds.
	for _, v := range []string{"a", "b", "d"} {
		var rs []float64
		for i := range rounds0 {
			rs = append(rs, rps0[v][i]/rps0["c"][i])
		}
		sort.Float64s(rs)
		fmt.Printf("same-round %s/c: median %.2f, range %.2f-%.2f\n", v, rs[len(rs)/2], rs[0], rs[len(rs)-1])
	}
	// By CPU time: c's per request over the variant's, per round and of
	// the medians (above 1: cheaper than c).
	var perRound []string
	for i := range rounds0 {
		var vs []string
		for _, v := range []string{"a", "c", "d", "b"} {
			vs = append(vs, fmt.Sprintf("%s %.0f (%.0f + %.0f)", v, cpuUs[v][i], cpuUs[v][i]-pgUs[v][i], pgUs[v][i]))
		}
		perRound = append(perRound, strings.Join(vs, " "))
	}
	fmt.Printf("CPU us per request (this process + PostgreSQL), per round: %s\n", strings.Join(perRound, "; "))
	cpuMed := map[string]float64{}
	for v, xs := range cpuUs {
		xs = append([]float64(nil), xs...)
		sort.Float64s(xs)
		cpuMed[v] = xs[len(xs)/2]
	}
	for _, v := range []string{"a", "b", "d"} {
		var rs []string
		for i := range rounds0 {
			rs = append(rs, fmt.Sprintf("%.2f", cpuUs["c"][i]/cpuUs[v][i]))
		}
		fmt.Printf("by CPU time, (%s)/(c): %.2f of the medians (%.0f / %.0f us), per round %s\n",
			v, cpuMed["c"]/cpuMed[v], cpuMed["c"], cpuMed[v], strings.Join(rs, ", "))
	}
}

// cpuSample: the CPU time (user + system) used so far by this process
// and by each PostgreSQL process that pg_stat_activity lists.
type cpuSample struct {
	self time.Duration
	pg   map[int32]time.Duration
}

func cpuNow(ctx context.Context, pool *pgxpool.Pool) cpuSample {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		log.Fatal(err)
	}
	c := cpuSample{self: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), pg: map[int32]time.Duration{}}
	rows, err := pool.Query(ctx, "SELECT pid FROM pg_stat_activity")
	if err != nil {
		log.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		log.Fatal(err)
	}
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // (ended meanwhile)
		}
		// Fields 14 and 15 (utime, stime) in clock ticks, after the
		// command in parentheses.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		c.pg[pid] = time.Duration(utime+stime) * time.Second / clockTicks
	}
	return c
}

// since: the CPU time used between c0 and c, by this process and by the
// PostgreSQL processes alive at c (one that started meanwhile from 0), and
// PostgreSQL's part of it.
func (c cpuSample) since(c0 cpuSample) (total, pg time.Duration) {
	for pid, t := range c.pg {
		pg += t - c0.pg[pid]
	}
	return c.self - c0.self + pg, pg
}

// clockTicks: USER_HZ, 100 on Linux for every architecture Go supports.
const clockTicks = 100

func amountOf(r *http.Request) int {
	var in struct {
		Amount int `json:"amount"`
	}
	json.NewDecoder(r.Body).Decode(&in)
	return in.Amount
}

func created(w http.ResponseWriter, id int64, amount int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(map[string]any{"id": id, "amount": amount})
}

// handWritten is idempotency without idem: a dedup row claimed with ON
// CONFLICT (a duplicate waits for the first's commit, then reads its
// response), the business insert, the response stored, one transaction.
func handWritten(pool *pgxpool.Pool, w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := r.Header.Get("Idempotency-Key")
	amount := amountOf(r)
	var stored []byte
	var id int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var claimed string
		err := tx.QueryRow(ctx, "INSERT INTO bench_dedup (key) VALUES ($1) ON CONFLICT DO NOTHING RETURNING key", key).Scan(&claimed)
		if err == pgx.ErrNoRows {
			return tx.QueryRow(ctx, "SELECT response::text FROM bench_dedup WHERE key = $1", key).Scan(&stored)
		} else if err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, "INSERT INTO bench_orders (amount) VALUES ($1) RETURNING id", amount).Scan(&id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "UPDATE bench_dedup SET response = jsonb_build_object('id', $2::bigint, 'amount', $3::int) WHERE key = $1", key, id, amount)
		return err
	})
	if err != nil {
		http.Error(w, err.Error(), 500)
		return
	}
	if stored != nil {
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(stored)
		return
	}
	created(w, id, amount)
}

func startProfile(path string) {
	f, err := os.Create(path)
	if err != nil {
		log.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		log.Fatal(err)
	}
}
