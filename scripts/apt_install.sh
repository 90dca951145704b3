#!/usr/bin/env bash
# apt-get install PACKAGE as root, waiting (at most APT_LOCK_WAIT_S seconds, default 300) for another
# apt or dpkg process to release its locks, and refreshing the package lists once if the first try
# fails. Exit 0 when installed; else print apt's last line to stderr and exit 1 (the caller warns).
set -u
pkg="$1"
wait_s="${APT_LOCK_WAIT_S:-300}"
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
apt_get() { apt-get -q -o "DPkg::Lock::Timeout=$wait_s" "$@" >"$log" 2>&1; }
if apt_get install -y "$pkg" || { apt_get update && apt_get install -y "$pkg"; }; then
    exit 0
fi
echo "apt-get: $(grep -v '^\s*$' "$log" | tail -n 1)" >&2
exit 1
