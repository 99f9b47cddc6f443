#!/bin/sh
# Best effort: install Debian's headless Chromium for the report's browser test (needs root and apt).
command -v chromium >/dev/null 2>&1 && exit 0
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || exit 1
(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || exit 1
command -v chromium >/dev/null 2>&1
