CREATE EXTENSION IF NOT EXISTS idem;
SELECT claimed, state FROM idem_claim('k', 'smoke');
