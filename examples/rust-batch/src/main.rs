//! A nightly settlement batch that can be killed at any moment and rerun.
//!
//! The run claims the job's key with a lease and commits it, so a second copy
//! of the job started by a scheduler sees `in_progress` and stays away. Each
//! item is settled in its own transaction together with `idem_checkpoint`,
//! so the checkpoint can never run ahead of, or fall behind, the settlements
//! that committed. After a crash (SIGKILL: no cleanup, no last words), the
//! rerun waits for the lease to run out, takes the claim over and reads the
//! last committed checkpoint from the claim's `result`: it resumes right
//! after it. A rerun after completion finds `completed` and does nothing.
//!
//! Connection: the libpq environment variables PGHOST (a host name or a
//! socket directory), PGPORT, PGUSER, PGDATABASE; directly or through
//! PgBouncer in transaction mode. For the pooler, statements outside a
//! transaction use `query_typed`/`execute_typed` (an unnamed statement, one
//! round trip): `query`/`execute` prepare a named statement ("s0", "s1", …)
//! in one round trip and bind it in the next, and between the two the
//! pooler may hand the server session to another client. Inside the item's
//! transaction the session stays this client's, so `execute` is fine there
//! (docs/operations.md, "Behind a pooler").
//! Options: --job NAME, --items N, --item-ms MS (simulated work per item),
//! --lease-secs S, and for tests --hang-at-item N: in item N's transaction,
//! once its settlement and checkpoint are written but before COMMIT, print
//! "item N: written, not committed; hanging until killed" and wait forever,
//! so that a test can kill the job at a known point (and see that item N's
//! settlement and checkpoint roll back together).

use std::time::{Duration, Instant};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

const BIZ_TYPE: &str = "batch";

struct Options {
    job: String,
    items: i32,
    item_ms: u64,
    lease_secs: f64,
    hang_at_item: Option<i32>,
}

fn options() -> Options {
    let mut o = Options {
        job: "daily_settle:2026-11-30:shard-3".into(),
        items: 100,
        item_ms: 20,
        lease_secs: 2.0,
        hang_at_item: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_else(|| usage(&format!("{} needs a value", args[i])));
        match args[i].as_str() {
            "--job" => o.job = value,
            "--items" => o.items = value.parse().unwrap_or_else(|_| usage("--items: a number")),
            "--item-ms" => o.item_ms = value.parse().unwrap_or_else(|_| usage("--item-ms: a number")),
            "--lease-secs" => o.lease_secs = value.parse().unwrap_or_else(|_| usage("--lease-secs: a number")),
            "--hang-at-item" => {
                o.hang_at_item = Some(value.parse().unwrap_or_else(|_| usage("--hang-at-item: a number")))
            }
            other => usage(&format!("unknown option {other}")),
        }
        i += 2;
    }
    o
}

fn usage(msg: &str) -> ! {
    eprintln!("batch: {msg}\nusage: batch [--job NAME] [--items N] [--item-ms MS] [--lease-secs S] [--hang-at-item N]");
    std::process::exit(2)
}

fn config_from_env() -> tokio_postgres::Config {
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
    let mut c = tokio_postgres::Config::new();
    // A value starting with "/" is a socket directory, as for libpq.
    c.host(env("PGHOST", "localhost"));
    c.port(env("PGPORT", "5432").parse().unwrap_or_else(|_| usage("PGPORT: a number")));
    c.user(env("PGUSER", "postgres"));
    c.dbname(env("PGDATABASE", "postgres"));
    c.application_name("idem-example-batch");
    c
}

async fn setup(db: &Client, items: i32) -> Result<(), tokio_postgres::Error> {
    // settlements has no unique constraint on item on purpose: a double
    // settlement must be visible to the test, not turned into an error.
    db.batch_execute(
        "CREATE EXTENSION IF NOT EXISTS idem;
         CREATE TABLE IF NOT EXISTS invoices (id int PRIMARY KEY, amount_cents int NOT NULL);
         CREATE TABLE IF NOT EXISTS settlements (
             item int NOT NULL, attempt int NOT NULL, pid int NOT NULL DEFAULT pg_backend_pid(),
             settled_at timestamptz NOT NULL DEFAULT clock_timestamp());",
    )
    .await?;
    db.execute_typed(
        "INSERT INTO invoices SELECT i, 1000 + i FROM generate_series(1, $1) i ON CONFLICT DO NOTHING",
        &[(&items, Type::INT4)],
    )
    .await?;
    Ok(())
}

struct Claim {
    attempt: i32,
    last_item: i32,
    lease_token: String,
}

/// Claim the job, waiting (bounded) while an earlier run's lease is still
/// running. None: the job was already completed.
async fn claim_job(db: &Client, o: &Options) -> Result<Option<Claim>, tokio_postgres::Error> {
    let started = Instant::now();
    let mut said_waiting = false;
    loop {
        let row = db
            .query_typed_one(
                "SELECT claimed, state, (result->>'attempt')::int,
                        coalesce((result->'recovery_data'->>'last_item')::int, 0),
                        result->>'lease_token', result::text
                   FROM idem_claim($1, $2, lease => make_interval(secs => $3))",
                &[(&o.job, Type::TEXT), (&BIZ_TYPE, Type::TEXT), (&o.lease_secs, Type::FLOAT8)],
            )
            .await?;
        let claimed: bool = row.get(0);
        let state: String = row.get(1);
        if claimed {
            return Ok(Some(Claim { attempt: row.get(2), last_item: row.get(3), lease_token: row.get(4) }));
        }
        match state.as_str() {
            "completed" => {
                let result: Option<String> = row.get(5);
                println!("job {}: already completed ({}): nothing to do", o.job, result.unwrap_or_default());
                return Ok(None);
            }
            "failed" => {
                let result: Option<String> = row.get(5);
                println!("job {}: failed earlier ({}): not rerun", o.job, result.unwrap_or_default());
                std::process::exit(1);
            }
            _ => {
                if !said_waiting {
                    println!(
                        "job {}: {} (a lease of an earlier run is still running): waiting for it to run out",
                        o.job, state
                    );
                    said_waiting = true;
                }
                if started.elapsed() > Duration::from_secs_f64(o.lease_secs * 10.0 + 10.0) {
                    eprintln!("job {}: still {} after {:?}; giving up", o.job, state, started.elapsed());
                    std::process::exit(1);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let o = options();
    let (mut db, connection) = match config_from_env().connect(NoTls).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("batch: cannot connect: {e}");
            std::process::exit(1)
        }
    };
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("batch: connection error: {e}");
        }
    });
    if let Err(e) = run(&mut db, &o).await {
        let code = e.code().map(|c| c.code().to_string()).unwrap_or_default();
        eprintln!("batch: {e} (SQLSTATE {code})");
        std::process::exit(1);
    }
}

async fn run(db: &mut Client, o: &Options) -> Result<(), tokio_postgres::Error> {
    setup(db, o.items).await?;
    let Some(claim) = claim_job(db, o).await? else { return Ok(()) };
    if claim.attempt == 1 {
        println!("job {}: claimed (attempt 1, lease {} s), starting at item 1", o.job, o.lease_secs);
    } else {
        println!(
            "job {}: took the claim over (attempt {}): the last committed checkpoint is item {}, resuming at item {}",
            o.job,
            claim.attempt,
            claim.last_item,
            claim.last_item + 1
        );
    }

    let todo: Vec<i32> = db
        .query_typed("SELECT id FROM invoices WHERE id > $1 ORDER BY id", &[(&claim.last_item, Type::INT4)])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut done = 0;
    for item in todo {
        // One transaction per item: the settlement and the checkpoint commit
        // together or not at all (a kill here rolls both back).
        let tx = db.transaction().await?;
        tx.execute("INSERT INTO settlements (item, attempt) VALUES ($1, $2)", &[&item, &claim.attempt]).await?;
        // The work the item stands for (a ledger call, a file write).
        tokio::time::sleep(Duration::from_millis(o.item_ms)).await;
        tx.execute(
            "SELECT idem_checkpoint($1, $2, 'item', jsonb_build_object('last_item', $3::int), lease_token => $4)",
            &[&o.job, &BIZ_TYPE, &item, &claim.lease_token],
        )
        .await?;
        if o.hang_at_item == Some(item) {
            // For tests: the kill point, announced on stdout (line by line).
            use std::io::Write;
            println!("item {item}: written, not committed; hanging until killed");
            std::io::stdout().flush().ok();
            std::future::pending::<()>().await;
        }
        tx.commit().await?;
        done += 1;
        if done == 1 || item % 10 == 0 || item == o.items {
            println!("item {item}: settled, checkpoint {item}");
        }
    }
    db.execute_typed(
        "SELECT idem_complete($1, $2, jsonb_build_object('items', $3, 'attempts', $4), lease_token => $5)",
        &[
            (&o.job, Type::TEXT),
            (&BIZ_TYPE, Type::TEXT),
            (&o.items, Type::INT4),
            (&claim.attempt, Type::INT4),
            (&claim.lease_token, Type::TEXT),
        ],
    )
    .await?;
    println!("job {}: completed; this run settled {} items (attempt {})", o.job, done, claim.attempt);
    Ok(())
}
