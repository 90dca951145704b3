#!/usr/bin/env bash
# Install Debian's chromium for the chat page's browser tests (tests/webui) when it is missing.
# Never fails the build: without it those tests skip, saying why. Never `playwright install`.
set -u
[ -x /usr/bin/chromium ] && exit 0
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: no /usr/bin/chromium; the browser tests will skip (apt-get install chromium as root)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q chromium >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
    || echo "note: could not install chromium; the browser tests will skip" >&2
exit 0
