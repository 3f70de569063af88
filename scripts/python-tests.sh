#!/usr/bin/env bash
# The Python package's tests (python/tests): a venv of its own, .venv-python,
# with `pip install ./python[agents,s3,test]` pinned by python/constraints.txt
# (the Agents SDK, openai-agents==0.24.0), then pytest against the binary
# built in target/ (SESSIONFS). The venv is made once and kept.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-python
stamp="$venv/.installed-$(sha256sum python/constraints.txt python/pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  echo "python-tests: making $venv (openai-agents, boto3, pytest; pinned)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -c python/constraints.txt './python[agents,s3,test]'
  touch "$stamp"
else
  # The package itself may have changed: reinstall it alone.
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall ./python
fi
export SESSIONFS="${SESSIONFS:-$PWD/target/debug/sessionfs}"
[ -x "$SESSIONFS" ] || cargo build --bin sessionfs
cd python
exec "../$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
