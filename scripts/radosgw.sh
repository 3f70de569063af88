#!/usr/bin/env bash
# Runs "$@" against Ceph's radosgw (Debian's packages): a one-node cluster on
# 127.0.0.1 (a monitor, an OSD on memstore, radosgw), made in a temporary
# directory and torn down after. `make test-radosgw`; see docs/remote.md.
set -euo pipefail
command -v radosgw >/dev/null || { export DEBIAN_FRONTEND=noninteractive; apt-get update -qq
  apt-get install -y -qq --no-install-recommends radosgw ceph-mon ceph-osd ceph-common >/dev/null; }
D=$(mktemp -d /tmp/sessionfs-ceph.XXXXXX)
stop() { local pids; pids=$(cat "$D"/run/*.pid 2>/dev/null || true); kill $pids 2>/dev/null || true
  for _ in $(seq 50); do kill -0 $pids 2>/dev/null || break; sleep 0.2; done; kill -9 $pids 2>/dev/null || true; rm -rf "$D"; }
trap stop EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MON=$(port) RGW=$(port) FSID=$(python3 -c 'import uuid; print(uuid.uuid4())')
mkdir -p "$D"/{log,run,rgw,mon/ceph-a,osd/ceph-0}
cat >"$D/ceph.conf" <<CONF
[global]
fsid = $FSID
mon host = v1:127.0.0.1:$MON
ms bind msgr2 = false
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
osd crush chooseleaf type = 0
mon allow pool size one = true
mon data avail crit = 1
run dir = $D/run
admin socket = $D/run/\$name.asok
log file = $D/log/\$name.log
pid file = $D/run/\$name.pid
keyring = $D/keyring
osd objectstore = memstore
memstore device bytes = 4294967296
osd data = $D/osd/\$cluster-\$id
mon data = $D/mon/\$cluster-\$id
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$RGW
rgw data = $D/rgw
CONF
C=(-c "$D/ceph.conf")
ceph-authtool --create-keyring "$D/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
monmaptool --create --add a "v1:127.0.0.1:$MON" --fsid "$FSID" "$D/monmap" >/dev/null
ceph-mon "${C[@]}" --mkfs -i a --monmap "$D/monmap" && ceph-mon "${C[@]}" -i a
UUID=$(python3 -c 'import uuid; print(uuid.uuid4())')
ID=$(timeout 60 ceph "${C[@]}" osd new "$UUID")
ceph-osd "${C[@]}" -i "$ID" --mkfs --osd-uuid "$UUID" 2>/dev/null && ceph-osd "${C[@]}" -i "$ID" 2>/dev/null
timeout 60 ceph "${C[@]}" osd crush add "osd.$ID" 1.0 host=localhost root=default >/dev/null 2>&1
radosgw "${C[@]}" -n client.rgw.a
timeout 120 radosgw-admin "${C[@]}" user create --uid=sessionfs --display-name=sessionfs \
  --access-key=AKIDSESSIONFSTEST --secret-key=secret-MUST-NOT-LEAK-7f3a >/dev/null
for _ in $(seq 120); do curl -sf -o /dev/null "http://127.0.0.1:$RGW/" && break; sleep 0.5; done
echo "radosgw $(radosgw --version | cut -d' ' -f3) on 127.0.0.1:$RGW" >&2
SESSIONFS_TEST_S3_PORT=$RGW "$@"
