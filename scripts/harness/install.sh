#!/usr/bin/env bash
# Installs the harness CLIs that tests/harness.rs drives, at the versions
# pinned in scripts/harness/versions, into .harness/ (ignored by git), and
# only when they are missing or pinned otherwise: a second run costs nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
mapfile -t pins < scripts/harness/versions
stamp=.harness/installed
if [ "$(cat "$stamp" 2>/dev/null)" = "${pins[*]}" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "harness: installing nodejs and npm" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
echo "harness: installing ${pins[*]} into .harness/" >&2
mkdir -p .harness
# Their install scripts put the platform's native binary (an optional
# dependency, already downloaded) in place of the launcher.
npm install --prefix .harness --no-audit --no-fund --loglevel=error "${pins[@]}" >&2
echo "${pins[*]}" > "$stamp"
