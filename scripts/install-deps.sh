#!/usr/bin/env bash
# Installs the Debian 12 packages hybridpd builds and tests with. Idempotent:
# does nothing when every package is already installed. Runs as root, or
# through sudo when available.
set -euo pipefail

pkgs=(build-essential cmake pkg-config
      libjansson-dev libxxhash-dev libcmocka-dev
      libevent-dev libmsgpack-dev libucx-dev ucx-utils libyaml-dev
      libpcre2-dev libutf8proc-dev libcurl4-openssl-dev curl python3-pip
      etcd-server)

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#pkgs[@]} packages present"
    exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: run as root (missing: ${missing[*]})" >&2; exit 1; }
    sudo=sudo
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
