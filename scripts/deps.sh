#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine (as root), and only
# what is missing: Debian packages via apt-get, Python tools into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have fusermount3 || need+=(fuse3)
have bsdtar || need+=(libarchive-tools)
have sqlite3 || need+=(sqlite3)
have git || need+=(git)
# tests/stat_times.rs asks make what it would rebuild.
have make || need+=(make)
have gcc || need+=(gcc)
# The Apple compile check (scripts/apple-check.sh): fuser's build script.
have pkg-config || need+=(pkg-config)
# tests/pods_containers.rs: the pod recipe with real containers (Docker,
# started by the test; its image made from busybox-static's root).
have dockerd || need+=(docker.io)
[ -x /bin/busybox ] || need+=(busybox-static)
# Python: the schema check's venv, and the second writer tests/spec_writer.rs runs.
if have python3; then
  python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
else
  need+=(python3 python3-venv)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python3 ] || ! .venv/bin/python3 -c 'import jsonschema' 2>/dev/null; then
  echo "deps: creating .venv with jsonschema" >&2
  python3 -m venv .venv
  .venv/bin/pip install -q jsonschema
fi

# moto's S3 server for the remote suites, pinned with all it pulls in, in
# .venv; the newest moto in a venv of its own (tests/remote_write.rs), which
# takes what it shares with .venv from there (a .pth), so only what differs
# is installed. The tests use these, never a moto found elsewhere.
moto_venv() { # VENV REQUIREMENTS [SHARED-VENV]
  local want; want=$(grep -o '^moto==.*' "$2" | cut -d= -f3)
  [ -x "$1/bin/python3" ] || python3 -m venv "$1"
  if [ -n "${3:-}" ]; then
    "$3/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
      >"$("$1/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/shared.pth"
  fi
  if [ "$("$1/bin/python3" -c 'import moto; print(moto.__version__)' 2>/dev/null)" != "$want" ]; then
    echo "deps: installing moto[server] $want into $1" >&2
    "$1/bin/pip" install -q -r "$2"
  fi
}
moto_venv .venv scripts/requirements-moto.txt
moto_venv .venv-moto-newest scripts/requirements-moto-newest.txt .venv
