CREATE EXTENSION IF NOT EXISTS idem;
\set VERBOSITY sqlstate
\set SHOW_CONTEXT never

-- A token is long, random, and stored only as its hash.
SELECT idem_issue_token('form.checkout') AS t \gset
SELECT length(:'t') AS token_length, :'t' ~ '^[0-9a-f]{64}$' AS hex;
SELECT count(*) FILTER (WHERE token_sha256 = convert_to(:'t', 'UTF8')) AS stored_in_clear,
       count(*) FILTER (WHERE token_sha256 = sha256(convert_to(:'t', 'UTF8'))) AS stored_hashed
  FROM idem.tokens;
SELECT idem_issue_token('form.checkout') <> idem_issue_token('form.checkout') AS distinct_tokens;

-- True exactly once.
SELECT idem_consume_token(:'t', 'form.checkout') AS first;
SELECT idem_consume_token(:'t', 'form.checkout') AS second;

-- A rollback un-spends it.
SELECT idem_issue_token('form.checkout') AS t2 \gset
BEGIN;
SELECT idem_consume_token(:'t2', 'form.checkout') AS inside;
ROLLBACK;
SELECT idem_consume_token(:'t2', 'form.checkout') AS after_rollback;

-- Unknown, wrong biz_type, expired: false.
SELECT idem_consume_token('not-a-token', 'form.checkout') AS unknown;
SELECT idem_issue_token('form.a') AS t3 \gset
SELECT idem_consume_token(:'t3', 'form.b') AS wrong_type;
SELECT idem_consume_token(:'t3', 'form.a') AS right_type;
SELECT idem_issue_token('form.short', '1 second') AS t4 \gset
SELECT pg_sleep(1.1);
SELECT idem_consume_token(:'t4', 'form.short') AS expired;

-- Bad input.
SELECT idem_issue_token(NULL);
SELECT idem_issue_token('bad type');
SELECT idem_issue_token('form.x', '0 seconds');
SELECT idem_issue_token('form.x', '401 days');
SELECT idem_consume_token(NULL, 'form.x');
