#!/usr/bin/env bash
# Installs the Debian packages treeattn builds with, when any is missing.
# Sourced by scripts/demo.sh and scripts/test.sh; safe to run repeatedly.
set -euo pipefail
pkgs=(cmake g++ make nlohmann-json3-dev libcli11-dev libgtest-dev libbenchmark-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "treeattn: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
    { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
