#!/bin/sh
# Debian's chromium for the browser tests (tests/web/): Playwright launches it by path, since
# `playwright install` cannot download a browser here. Does nothing when chromium is there.
set -e
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "chromium is missing: run 'apt-get install -y chromium' as root (tests/web/ needs it)" >&2
    exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
