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

# moto's S3 server for tests/remote.rs: the image's Python may have it.
if ! python3 -c 'import moto.server' 2>/dev/null && ! .venv/bin/python3 -c 'import moto.server' 2>/dev/null; then
  echo "deps: installing moto[server] into .venv" >&2
  .venv/bin/pip install -q 'moto[server]'
fi
