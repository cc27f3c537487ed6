//! A probe for tests/scenarios/clients.sh pgbouncer: what tokio-postgres sends, and
//! what becomes of it when PgBouncer (transaction mode) gives consecutive
//! round trips of one client to different clients' server session.
//!
//! Modes (connection from PGHOST, PGPORT, PGUSER, PGDATABASE):
//!   hold      Client::prepare a statement (a named one, "s0"), print "ready",
//!             wait for a line on stdin, then run it.
//!   query     Client::query with a string: prepare (named "s0") and run.
//!   typed     Client::query_typed: an unnamed statement, one round trip.
//!   leftover  Client::query_typed of a query whose result is not a built-in
//!             type, then list the server session's named statements.
//! Each prints "pid N" (its server session for that statement) and one line:
//! "result: ..." or "error SQLSTATE: message".

use std::io::BufRead;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

async fn pid(db: &Client) -> String {
    match db.simple_query("SELECT pg_backend_pid()").await {
        Ok(msgs) => msgs
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
            .unwrap_or_default(),
        Err(e) => format!("? ({e})"),
    }
}

fn report<T>(r: Result<T, tokio_postgres::Error>, show: impl Fn(T) -> String) {
    match r {
        Ok(v) => println!("result: {}", show(v)),
        Err(e) => {
            let code = e.code().map(|c| c.code().to_string()).unwrap_or_else(|| "-".into());
            let msg = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_else(|| e.to_string());
            println!("error {code}: {msg}");
        }
    }
}

fn text(rows: Vec<tokio_postgres::Row>) -> String {
    rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join(",")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
    let mut c = tokio_postgres::Config::new();
    c.host(env("PGHOST", "localhost"));
    c.port(env("PGPORT", "5432").parse().expect("PGPORT"));
    c.user(env("PGUSER", "postgres"));
    c.dbname(env("PGDATABASE", "postgres"));
    let (db, connection) = c.connect(NoTls).await.expect("connect");
    tokio::spawn(connection);
    match mode.as_str() {
        "hold" => {
            let stmt = match db.prepare("SELECT 'statement of the first client: ' || $1::text").await {
                Ok(stmt) => stmt,
                Err(e) => return report(Err::<(), _>(e), |_| String::new()),
            };
            println!("pid {}", pid(&db).await);
            println!("ready");
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).expect("stdin");
            // Bind and execute the prepared statement by its name: what
            // Client::query does right after its own prepare.
            report(db.query(&stmt, &[&"x"]).await, text);
        }
        "query" => {
            println!("pid {}", pid(&db).await);
            report(db.query("SELECT 'statement of the second client: ' || $1::text", &[&"y"]).await, text);
        }
        "typed" => {
            println!("pid {}", pid(&db).await);
            report(
                db.query_typed("SELECT 'statement of the second client: ' || $1", &[(&"y", Type::TEXT)]).await,
                text,
            );
        }
        "leftover" => {
            println!("pid {}", pid(&db).await);
            report(db.query_typed("SELECT idem_lookup($1, 'probe')", &[(&"k", Type::TEXT)]).await, |rows| {
                format!("{} row(s)", rows.len())
            });
            report(
                db.query_typed(
                    "SELECT coalesce(string_agg(name, ',' ORDER BY name), '') FROM pg_prepared_statements",
                    &[],
                )
                .await,
                |rows| format!("named statements left on the server session: [{}]", text(rows)),
            );
        }
        _ => {
            eprintln!("usage: idem-pooler-probe hold|query|typed|leftover");
            std::process::exit(2);
        }
    }
    // Leave only once the server session is idle. tokio-postgres reports an
    // error before the server's ReadyForQuery has arrived; a client that
    // disconnects then makes PgBouncer close the server session (it is not
    // idle), and the next client would get a new one.
    let _ = db.simple_query("SELECT 1").await;
}
