#!/usr/bin/env bash
# System packages the tests need beyond Python: Debian's chromium, so a test can render
# report.html in a real headless browser. Idempotent: does nothing when it is installed.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ci_system_deps: no apt-get here; chromium not installed (the browser test will skip)" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
    echo "ci_system_deps: not root and no sudo; chromium not installed (the browser test will skip)" >&2
    exit 0
  fi
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
