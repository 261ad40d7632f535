#!/usr/bin/env bash
# The Debian packages the integration tests use, at the versions lock/debian.txt records:
# installed when missing and we are root; otherwise their tests skip, naming what to
# install. A recorded version the archive no longer has (Debian replaces a release's
# package on a security update) is said, and the archive's own is installed instead.
set -euo pipefail
cd "$(dirname "$0")"
missing=()
while IFS='=' read -r name version; do
  [ -z "$name" ] && continue
  have=$(dpkg-query -W -f='${Version}' "$name" 2>/dev/null || true)
  if [ -z "$have" ]; then
    missing+=("$name=$version")
  elif [ "$have" != "$version" ]; then
    echo "$name: $have installed, the lock records $version (make lock records what is installed)"
  fi
done < debian.txt
[ ${#missing[@]} = 0 ] && exit 0
names=("${missing[@]%%=*}")
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "not root: install ${names[*]} (apt-get install ${missing[*]}); their tests will skip"
  exit 0
fi
echo "installing: ${missing[*]}"
apt-get update -qq
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; then
  echo "the archive lacks a recorded version: installing its own of ${names[*]}"
  apt-get install -y -qq "${names[@]}" >/dev/null
fi
