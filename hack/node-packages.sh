#!/usr/bin/env bash
# Installs, from Debian's packages, what the test node (test/node) does not
# build from Go modules: runc, the CNI plugins, iptables and conntrack for
# kube-proxy, ip and ss (iproute2: the node's bridge, and a fault that
# resets connections) and the CA roots the image carries. Needs root; does
# nothing when all are there.
set -euo pipefail
packages=(runc containernetworking-plugins iptables conntrack iproute2 ca-certificates)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
