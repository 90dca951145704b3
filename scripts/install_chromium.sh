#!/usr/bin/env bash
# Install Debian's chromium for the chat page's browser tests (tests/webui) when it is missing.
# Never fails the build: without it those tests skip, saying why. Never `playwright install`.
set -u
[ -x /usr/bin/chromium ] && exit 0
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: no /usr/bin/chromium; the browser tests will skip (apt-get install chromium as root)" >&2
    exit 0
fi
if ! bash "$(dirname "$0")/apt_install.sh" chromium; then
    echo "WARNING: could not install chromium (above); the browser tests will skip. Run 'make chromium'" \
         "again once apt is free." >&2
fi
exit 0
