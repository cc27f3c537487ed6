package main_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// readmeBlock is the Go code block after marker in clients/go/README.md.
func readmeBlock(t *testing.T, marker string) string {
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(raw), marker+"\n```go\n")
	code, _, closed := strings.Cut(rest, "\n```\n")
	if !ok || !closed {
		t.Fatalf("README.md has no Go block after %q", marker)
	}
	return code + "\n"
}

// The gin adapter the README shows is the one the gin server runs.
func TestReadmeGinAdapter(t *testing.T) {
	src, err := os.ReadFile("server/gin.go")
	if err != nil {
		t.Fatal(err)
	}
	if block := readmeBlock(t, "<!-- gin adapter -->"); !bytes.Contains(src, []byte(block)) {
		t.Fatalf("the README's gin adapter is not server/gin.go's:\n%s", block)
	}
}

// The README's complete app, built and run as written (in a module of its
// own that requires this one, offline from the module cache), against
// the scenario's database: a retry is replayed, another tenant's same key
// is its own order, and one order exists per intent.
func TestReadmeApp(t *testing.T) {
	dir := t.TempDir()
	lib, _ := filepath.Abs("..")
	// The requirements of this module (a superset of the app's), so that
	// the build needs no module the cache lacks.
	own, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	gomod := strings.Replace(strings.Replace(string(own), "module github.com/idem-pg/idem/clients/go/test", "module readmeapp", 1),
		"=> ../", "=> "+lib, 1)
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"main.go": readmeBlock(t, "<!-- app: main.go -->"), "go.mod": gomod, "go.sum": string(sum)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command("go", "build", "-race", "-o", "app", ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the README's app does not build: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	app := exec.Command(filepath.Join(dir, "app"))
	app.Env = append(os.Environ(), "DATABASE_URL="+os.Getenv("IDEM_TEST_CHECK_DSN"), "ADDR="+addr)
	var logs bytes.Buffer
	app.Stdout, app.Stderr = &logs, &logs
	if err := app.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { app.Process.Kill(); app.Wait() }()
	// Up once it accepts a connection (it creates its table first).
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if i == 2400 || app.ProcessState != nil {
			t.Fatalf("the README's app did not start: %s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	key := `"readme-` + runID() + `"`
	post := func(token, body string) response {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/orders", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Idempotency-Key", key)
		return send(req)
	}
	var before int
	checkDB.QueryRow(context.Background(), "SELECT count(*) FROM orders").Scan(&before)
	first := post("token-acme", `{"sku": "sku-1", "qty": 2}`)
	retry := post("token-acme", `{ "qty": 2, "sku": "sku-1" }`)
	other := post("token-globex", `{"sku": "sku-1", "qty": 2}`)
	changed := post("token-acme", `{"sku": "sku-1", "qty": 3}`)
	unknown := post("token-nobody", `{"sku": "sku-1", "qty": 2}`)
	var after int
	checkDB.QueryRow(context.Background(), "SELECT count(*) FROM orders").Scan(&after)
	if first.status != 201 || first.header.Get("Location") == "" || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %s", first)
	}
	if retry.status != 201 || !bytes.Equal(retry.body, first.body) || retry.header.Get("Idempotent-Replayed") != "true" ||
		retry.header.Get("Location") != first.header.Get("Location") {
		t.Fatalf("retry: %s (first %s)", retry, first)
	}
	if other.status != 201 || other.header.Get("Idempotent-Replayed") != "" || bytes.Equal(other.body, first.body) {
		t.Fatalf("another account, the same key: %s", other)
	}
	if changed.status != 422 || unknown.status != 401 || after-before != 2 {
		t.Fatalf("changed body %d, unknown token %d, %d orders made (want 2); log:\n%s", changed.status, unknown.status,
			after-before, logs.String())
	}
}
