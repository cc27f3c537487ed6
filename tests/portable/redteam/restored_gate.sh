#!/usr/bin/env bash
# A plain-script install's pg_dump carries idem.key_gates' rows (writer xid8
# values of the source cluster). Restored into a cluster whose xid counter is
# behind the source's (any fresh cluster), a gate names a *future* xid; the
# transaction that is later assigned that xid is "gated" for the key
# (idem.probe: writer = me), so idem_claim skips the key lock and a second
# session claims the same key concurrently: two live claims.
# The xid gap is simulated by moving the restored writers ahead of the
# counter (what a restore into a younger cluster does).
# Needs: /tmp/rt/env.sh (socket, port), roles rt_owner rt_app, dist in /tmp/rt/dist.
set -u
source /tmp/rt/env.sh
P postgres postgres -c "drop database if exists rt_src with (force)" -c "drop database if exists rt_dst with (force)" >/dev/null
P postgres postgres -c "create database rt_src owner rt_owner" -c "create database rt_dst owner rt_owner" >/dev/null
P rt_owner rt_src -v ON_ERROR_STOP=1 -f $PORTABLE_DIST/idem_portable.sql >/dev/null
# k: claimed, then forgotten: the gate stays, no claim row.
P rt_app rt_src -Atc "select idem_claim('k','pay')" >/dev/null
P rt_owner rt_src -Atc "select idem_forget('k','pay')" >/dev/null
pg_dump -h $PORTABLE_HOST -p $PORTABLE_PORT -U rt_owner rt_src | P rt_owner rt_dst -v ON_ERROR_STOP=1 >/dev/null 2>&1
# simulate the younger cluster: the restored writer is 50 xids ahead
W=$(P rt_owner rt_dst -Atc "update idem.key_gates set writer = (pg_current_xact_id()::text::bigint + 50)::text::xid8 returning writer")
echo "restored gate writer: $W"
# burn xids until the next one assigned is W
while :; do n=$(P rt_owner rt_dst -Atc "select pg_current_xact_id()"); [ $((n + 1)) -ge $W ] && break; done
coproc A { P rt_app rt_dst -At 2>&1; }
echo "begin; select pg_current_xact_id();" >&${A[1]}; read -r xa <&${A[0]}; echo "A's xid: $xa"
coproc B { P rt_app rt_dst -At 2>&1; }
echo "begin; select (idem_claim('k','pay')).claimed;" >&${B[1]}; read -r rb <&${B[0]}; echo "B claimed: $rb"
echo "select (idem_claim('k','pay')).claimed;" >&${A[1]}     # A: no lock taken; blocks on its gate UPDATE
until [ "$(P postgres rt_dst -Atc "select count(*) from pg_stat_activity where datname='rt_dst' and wait_event_type='Lock'")" = 1 ]; do :; done
echo "commit;" >&${B[1]}
read -r ra <&${A[0]}; echo "A claimed: $ra"
echo "commit;" >&${A[1]}; echo '\q' >&${A[1]}; echo '\q' >&${B[1]}; wait
P rt_owner rt_dst -Atc "select count(*) as live_claims_of_k from idem.claims where biz_type='pay' and key='k'"
P rt_app rt_dst -Atc "select idem_lookup('k','pay')" 2>&1
