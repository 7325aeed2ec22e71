#!/usr/bin/env bash
# debian_root.sh: unpacks Debian packages of one architecture and release
# into DIR/root, with apt run on private lists, cache and status under DIR
# (nothing on the system changes): a Python and the libraries it loads, to
# run a wheel in another Debian than the host's (tests/install/arm64.sh:
# bookworm's arm64 Python under qemu; tests/install/run.sh: bullseye's
# Python 3.9 on its glibc 2.31). Logs to DIR/apt.log; exits non-zero, with
# the log, on any failure.
#   usage: tests/install/debian_root.sh ARCH(amd64|arm64) RELEASE DIR PACKAGE...
set -euo pipefail
arch=${1:?usage: debian_root.sh ARCH RELEASE DIR PACKAGE...} release=${2:?RELEASE} dir=${3:?DIR}
shift 3
apt_dir="$dir/apt" root="$dir/root"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs" "$root"
: >"$apt_dir/status"
echo "deb [arch=$arch signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $release main" \
    >"$apt_dir/sources.list"
apt_opts=(-o APT::Architecture="$arch" -o APT::Architectures::="$arch" -o Dir::State::Lists="$apt_dir/lists"
          -o Dir::State::status="$apt_dir/status" -o Dir::Cache="$apt_dir/cache"
          -o Dir::Etc::sourcelist="$apt_dir/sources.list" -o Dir::Etc::sourceparts=/nonexistent
          -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
fail() { cat "$dir/apt.log" >&2; echo "debian_root: $1" >&2; exit 1; }
apt-get "${apt_opts[@]}" -q update >"$dir/apt.log" 2>&1 || fail "apt-get update ($release $arch lists) failed"
(cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" -q download "$@") >>"$dir/apt.log" 2>&1 \
    || fail "downloading the $release $arch packages failed"
for deb in "$apt_dir"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
