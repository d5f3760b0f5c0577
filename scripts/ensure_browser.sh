#!/usr/bin/env bash
# The real-browser tests (tests/browser/) drive Debian's chromium headless; playwright's own
# browser download cannot reach the internet here, so the system browser is used instead.
# Installs it with apt-get when it is absent and we are root (as in CI); otherwise says
# what to do and exits 0, so the browser tests skip with that reason instead of failing
# the whole run. Set RLPROBE_NO_BROWSER_INSTALL=1 to never install.
set -euo pipefail
BROWSER=${RLPROBE_CHROMIUM:-/usr/bin/chromium}
if [ -x "$BROWSER" ]; then
  exit 0
fi
if [ "${RLPROBE_NO_BROWSER_INSTALL:-0}" = "1" ]; then
  echo "ensure_browser: $BROWSER absent and RLPROBE_NO_BROWSER_INSTALL=1: browser tests will skip"
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure_browser: $BROWSER not found; the browser tests (tests/browser) will skip."
  echo "  On Debian/Ubuntu: sudo apt-get update && sudo apt-get install -y chromium"
  echo "  Elsewhere: point RLPROBE_CHROMIUM at a Chromium or Chrome binary."
  exit 0
fi
echo "ensure_browser: installing Debian's chromium (for tests/browser) ..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
"$BROWSER" --version
