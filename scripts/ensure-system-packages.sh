#!/usr/bin/env bash
# Installs the Debian packages that tests run for real, when any is missing:
#   libpython3.11    Triton's python-backend stub embeds it (the CPU reference runtime)
#   python3-torch    CPU-only torch 1.13 for that runtime's model: 152 MB to download, where PyPI's
#                    only Linux x86_64 build bundles CUDA (3.2 GB with its nvidia-* wheels)
#   libopenblas0-serial  the BLAS that torch multiplies with, as in the cpu-runtime image (Debian's
#                    default is the reference BLAS, 7x slower)
#   openmpi-bin      mpirun, which launches TensorRT-LLM's ranks in the serving pods
#   containerd, runc, containernetworking-plugins, nftables, iptables
#                    the embedded cluster's real node (e2e/cluster/node.py): container runtime, CNI
#                    bridge/host-local/portmap, kube-proxy's nftables mode (portmap uses iptables)
#   ipset            kube-router's network policy controller, the test world's NetworkPolicy
#                    enforcer (its iptables rules match ipsets it fills with `ipset restore`)
#   busybox-static   the node's stand-in sandbox image and the tests' tiny web server
#   debootstrap      the Debian rootfs of the locally built images (python -m images.builder)
#   gcc, libc6-dev   the static pause (sandbox) binary of those images (libc6-dev ships libc.a)
#   apache2-utils    htpasswd: the bcrypt password file of the test world's registry
# Needs root or passwordless sudo once; later runs only ask dpkg (milliseconds).
set -euo pipefail
packages=(libpython3.11 python3-torch libopenblas0-serial openmpi-bin
  containerd runc containernetworking-plugins nftables iptables ipset busybox-static debootstrap gcc libc6-dev apache2-utils)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || {
    echo "ensure-system-packages: not a Debian/Ubuntu machine; install the equivalents of: ${missing[*]}" >&2
    exit 1
  }
  if [ "$(id -u)" = 0 ]; then sudo=(); elif sudo -n true 2>/dev/null; then sudo=(sudo -n); else
    echo "ensure-system-packages: run once as root: apt-get install --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  echo "ensure-system-packages: installing ${missing[*]}" >&2
  start=$SECONDS
  install=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends)
  # A fresh machine may have no package lists yet: update once and retry.
  "${install[@]}" "${missing[@]}" >/dev/null 2>&1 \
    || { "${sudo[@]}" apt-get update -q >/dev/null && "${install[@]}" "${missing[@]}" >/dev/null; } \
    || { echo "ensure-system-packages: apt-get install ${missing[*]} failed" >&2; exit 1; }
  echo "ensure-system-packages: installed in $((SECONDS - start)) s" >&2
fi
