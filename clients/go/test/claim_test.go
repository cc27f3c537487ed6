package main_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"testing"
	"time"

	idem "github.com/idem-pg/idem/clients/go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// The core API over both drivers: each test runs once on a pgx.Tx and once
// on a *sql.Tx (pgx's database/sql driver).
type begin func(t *testing.T) (tx any, commit func() error, rollback func())

func drivers(t *testing.T) map[string]begin {
	db := stdlib.OpenDBFromPool(checkDB)
	t.Cleanup(func() { db.Close() })
	return map[string]begin{
		"pgx": func(t *testing.T) (any, func() error, func()) {
			tx, err := checkDB.Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return tx, func() error { return tx.Commit(context.Background()) }, func() { tx.Rollback(context.Background()) }
		},
		"database/sql": func(t *testing.T) (any, func() error, func()) {
			tx, err := db.BeginTx(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			return tx, tx.Commit, func() { tx.Rollback() }
		},
	}
}

func TestClaim(t *testing.T) {
	ctx := context.Background()
	for name, begin := range drivers(t) {
		t.Run(name, func(t *testing.T) {
			key := "claim-" + runID()
			// First arrival: claimed; the business write and the stored
			// result commit together.
			tx, commit, rollback := begin(t)
			c, err := idem.Claim(ctx, tx, key, "go.claims", idem.WithFingerprint("fp-1"), idem.WithTTL(time.Hour))
			if err != nil || !c.Claimed || c.State != idem.StateNew || c.ExpiresAt.Sub(c.FirstClaimedAt) != time.Hour {
				t.Fatalf("first claim: %+v, %v", c, err)
			}
			if err := c.Complete(ctx, map[string]any{"order_id": 7}); err != nil {
				t.Fatal(err)
			}
			if err := c.Complete(ctx, nil); err == nil {
				t.Fatal("a second Complete was accepted")
			}
			if err := commit(); err != nil {
				t.Fatal(err)
			}
			// A duplicate: the stored result.
			tx, _, rollback = begin(t)
			c, err = idem.Claim(ctx, tx, key, "go.claims", idem.WithFingerprint("fp-1"))
			var got struct {
				OrderID int `json:"order_id"`
			}
			if err != nil || c.Claimed || c.State != idem.StateCompleted || c.Decode(&got) != nil || got.OrderID != 7 {
				t.Fatalf("duplicate: %+v, %v", c, err)
			}
			rollback()
			// Another fingerprint: ID001, typed.
			tx, _, rollback = begin(t)
			_, err = idem.Claim(ctx, tx, key, "go.claims", idem.WithFingerprint("fp-2"))
			var ie *idem.Error
			if !errors.Is(err, idem.ErrFingerprintMismatch) || !errors.As(err, &ie) || ie.Code != "ID001" || errors.Is(err, idem.ErrTransient) {
				t.Fatalf("another fingerprint: %v", err)
			}
			rollback()
			// Complete on a claim this transaction did not make: ID003.
			tx, _, rollback = begin(t)
			err = idem.Complete(ctx, tx, "never-claimed-"+runID(), "go.claims", json.RawMessage(`{}`), "")
			if !errors.Is(err, idem.ErrNotHeld) || idem.SQLState(err) != "ID003" {
				t.Fatalf("Complete without a claim: %v", err)
			}
			rollback()
			// A stored business failure.
			key2 := "fail-" + runID()
			tx, commit, _ = begin(t)
			c, err = idem.Claim(ctx, tx, key2, "go.claims")
			if err != nil || c.Fail(ctx, map[string]string{"error": "out of stock"}) != nil || commit() != nil {
				t.Fatalf("fail: %v", err)
			}
			tx, _, rollback = begin(t)
			c, err = idem.Claim(ctx, tx, key2, "go.claims")
			if err != nil || c.State != idem.StateFailed || string(c.Result) != `{"error": "out of stock"}` {
				t.Fatalf("failed claim: %+v %s, %v", c, c.Result, err)
			}
			rollback()
			// A bad business type: 22023, not transient.
			tx, _, rollback = begin(t)
			_, err = idem.Claim(ctx, tx, key, "bad type!")
			if idem.SQLState(err) != "22023" || errors.Is(err, idem.ErrTransient) {
				t.Fatalf("bad biz_type: %v", err)
			}
			rollback()
		})
	}
}

// A claim held by an open transaction: a duplicate with WithWait(false)
// gets in_progress; a waiting one bounded by WithLockTimeout gets 55P03
// (ErrLockTimeout, transient); the holder's lock_timeout is untouched.
// A business type that retries stored failures (idem_configure's
// on_failure 'retry'): the next arrival after Fail claims anew, told its
// attempt; once completed, the key is never claimed again.
func TestClaimRetryAfterFailure(t *testing.T) {
	ctx := context.Background()
	if _, err := checkDB.Exec(ctx, "SELECT idem_configure('go.retry', NULL, 'retry')"); err != nil {
		t.Fatal(err)
	}
	for name, begin := range drivers(t) {
		t.Run(name, func(t *testing.T) {
			key := "retry-" + runID()
			claim := func() *idem.ClaimResult {
				t.Helper()
				tx, commit, rollback := begin(t)
				defer rollback()
				c, err := idem.Claim(ctx, tx, key, "go.retry")
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case c.Claimed && c.Attempt == 1:
					err = c.Fail(ctx, map[string]any{"declined": key})
				case c.Claimed:
					err = c.Complete(ctx, map[string]any{"charged": key})
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := commit(); err != nil {
					t.Fatal(err)
				}
				return c
			}
			if c := claim(); !c.Claimed || c.State != idem.StateNew || c.Attempt != 1 {
				t.Fatalf("first claim: %+v", c)
			}
			c := claim()
			var told struct {
				Attempt       int               `json:"attempt"`
				PreviousError map[string]string `json:"previous_error"`
			}
			if !c.Claimed || c.State != idem.StateNew || c.Attempt != 2 || c.LeaseToken != "" ||
				c.Decode(&told) != nil || told.Attempt != 2 || told.PreviousError["declined"] != key {
				t.Fatalf("the retry after the failure: %+v (%s)", c, c.Result)
			}
			if c := claim(); c.Claimed || c.State != idem.StateCompleted || c.Attempt != 0 || string(c.Result) != `{"charged": "`+key+`"}` {
				t.Fatalf("after completion: %+v (%s)", c, c.Result)
			}
		})
	}
}

func TestClaimConcurrent(t *testing.T) {
	ctx := context.Background()
	for name, begin := range drivers(t) {
		t.Run(name, func(t *testing.T) {
			key := "busy-" + runID()
			holder, _, rollbackHolder := begin(t)
			defer rollbackHolder()
			if c, err := idem.Claim(ctx, holder, key, "go.claims"); err != nil || !c.Claimed {
				t.Fatalf("holder: %+v %v", c, err)
			}
			tx, _, rollback := begin(t)
			c, err := idem.Claim(ctx, tx, key, "go.claims", idem.WithWait(false))
			if err != nil || c.Claimed || c.State != idem.StateInProgress {
				t.Fatalf("no wait: %+v %v", c, err)
			}
			rollback()
			tx, _, rollback = begin(t)
			_, err = idem.Claim(ctx, tx, key, "go.claims", idem.WithLockTimeout(100*time.Millisecond))
			if !errors.Is(err, idem.ErrLockTimeout) || !errors.Is(err, idem.ErrTransient) || idem.SQLState(err) != "55P03" {
				t.Fatalf("bounded wait: %v", err)
			}
			rollback()
			// The bound is the claim's only: the setting after it is the session's.
			tx, _, rollback = begin(t)
			if _, err := idem.Claim(ctx, tx, "free-"+runID(), "go.claims", idem.WithLockTimeout(time.Second)); err != nil {
				t.Fatal(err)
			}
			var lt string
			row := queryRow(tx, "SHOW lock_timeout")
			if err := row.Scan(&lt); err != nil || lt != "0" {
				t.Fatalf("lock_timeout after the claim: %q %v", lt, err)
			}
			rollback()
		})
	}
}

// A serialization failure in the transaction is transient.
func TestTransientClassified(t *testing.T) {
	for name, begin := range drivers(t) {
		t.Run(name, func(t *testing.T) {
			tx, _, rollback := begin(t)
			defer rollback()
			var ignored sql.NullString
			err := queryRow(tx, "SELECT raise_sqlstate('40001')::text").Scan(&ignored)
			if !idem.IsTransient(err) || idem.SQLState(err) != "40001" {
				t.Fatalf("40001: %v", err)
			}
		})
	}
}

func queryRow(tx any, q string) interface{ Scan(...any) error } {
	switch x := tx.(type) {
	case pgx.Tx:
		return x.QueryRow(context.Background(), q)
	case *sql.Tx:
		return x.QueryRow(q)
	}
	panic("unknown tx")
}
