"""Q5: two transactions of N claims over the same keys in opposite orders:
one must get 40P01 (not hang); the pg_locks rows of each while one waits.
usage: python deadlock_batch.py HOST PORT DB ROLE N"""
import sys, threading, uuid, time
import psycopg
host, port, db, role, n = sys.argv[1:6]; n = int(n)
tag = uuid.uuid4().hex[:6]
mon = psycopg.connect(host=host, port=port, dbname=db, user='postgres', autocommit=True)
res = {}
def run(name, order, hold):
    c = psycopg.connect(host=host, port=port, dbname=db, user=role)
    res[name + '_pid'] = c.info.backend_pid
    try:
        c.execute(f"select count(*) from (select idem_claim('{tag}-' || g, 'rt') from generate_series(%s::int, %s::int, %s::int) g) s", order)
        hold.wait(600)
        c.commit(); res[name] = 'committed'
    except psycopg.Error as e:
        res[name] = e.sqlstate; c.rollback()
hold = threading.Event()
ta = threading.Thread(target=run, args=('A', (1, n, 1), hold)); tb = threading.Thread(target=run, args=('B', (n, 1, -1), hold))
ta.start(); tb.start()
peak = 0
while ta.is_alive() or tb.is_alive():
    r = mon.execute("select count(*) from pg_locks where pid in (%s, %s)", (res.get('A_pid', 0), res.get('B_pid', 0))).fetchone()[0]
    peak = max(peak, r)
    if 'A' in res or 'B' in res: hold.set()
    time.sleep(0.05)
ok = sorted([res['A'], res['B']]) == ['40P01', 'committed']
print(("ok" if ok else "FAIL") + f": {n} claims each, opposite orders: A={res['A']} B={res['B']} peak pg_locks rows of both={peak}")
