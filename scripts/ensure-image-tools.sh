#!/usr/bin/env bash
# Installs the Debian packages `python -m images.builder` needs, when any is missing:
#   debootstrap        the Debian rootfs under the operator and CPU runtime images (no base image pull)
#   gcc, libc6-dev     the static pause binary (libc6-dev ships libc.a)
# Building also needs root (debootstrap, chroot, bind mounts); this script needs root or
# passwordless sudo only when it has something to install.
set -euo pipefail
packages=(debootstrap gcc libc6-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
command -v apt-get >/dev/null || {
  echo "ensure-image-tools: not a Debian/Ubuntu machine; install the equivalents of: ${missing[*]}" >&2
  exit 1
}
if [ "$(id -u)" = 0 ]; then sudo=(); elif sudo -n true 2>/dev/null; then sudo=(sudo -n); else
  echo "ensure-image-tools: run once as root: apt-get install --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "ensure-image-tools: installing ${missing[*]}" >&2
install=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends)
# A fresh machine may have no package lists yet: update once and retry.
"${install[@]}" "${missing[@]}" >/dev/null 2>&1 \
  || { "${sudo[@]}" apt-get update -q >/dev/null && "${install[@]}" "${missing[@]}" >/dev/null; } \
  || { echo "ensure-image-tools: apt-get install ${missing[*]} failed" >&2; exit 1; }
