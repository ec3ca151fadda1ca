#!/usr/bin/env bash
# The fresh-machine test: the README's two commands on a bare Debian 12 root.
#
# Builds a minimal Debian 12 (bookworm) root with debootstrap (cached between runs), copies it,
# clones this checkout's HEAD into it, mounts /proc, /sys and /dev, installs only `make` (and
# ccache, where this machine has it; see CCACHE_DIR), and runs
# `make demo` and `make test` inside it with chroot. Prints one line with the result and the time;
# the full log stays in the cache folder. Mounts are undone and the copy removed on every exit (a
# run killed before it could: by the next run).
#
#   scripts/fresh-machine-test.sh [--keep] [--refresh]
#     --keep      leave the used root in place (its path is printed) to look inside
#     --refresh   rebuild the cached pristine root
# Environment:
#   SEQPAR_FRESH_CACHE  cache folder (default /var/cache/seqpar-fresh): the pristine root, the
#                       downloaded .deb files (reused, never the installed state) and the logs
#   SEQPAR_FRESH_MIRROR Debian mirror (default http://deb.debian.org/debian)
#   PIP_CACHE_DIR       pip's cache on this machine, bind-mounted into the root when it exists, so
#                       wheels are downloaded once per machine
#   CCACHE_DIR          ccache's cache on this machine (default ~/.cache/ccache): where this
#                       machine has ccache, the root gets the same package and borrows the cache,
#                       so the files this machine built already compile as lookups (an
#                       accelerator only: a missing header or library still fails the build)
#   PIP_CERT, http_proxy, https_proxy, no_proxy
#                       the network's settings, passed into the root as the machine's own (like
#                       /etc/resolv.conf): a network whose TLS egress is re-signed by a local CA
#                       gives pip that CA's bundle, copied into the root
# Needs root, debootstrap (installed from Debian if missing), mount and chroot. Exit 0 pass,
# 1 fail (a step failed, or the machine forbids mount or chroot: one line says which).
set -uo pipefail

keep=0
refresh=0
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    --refresh) refresh=1 ;;
    *) echo "fresh-machine: unknown argument '$arg' (valid: --keep, --refresh)" >&2; exit 2 ;;
  esac
done

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${SEQPAR_FRESH_CACHE:-/var/cache/seqpar-fresh}
mirror=${SEQPAR_FRESH_MIRROR:-http://deb.debian.org/debian}
pip_cache=${PIP_CACHE_DIR:-$HOME/.cache/pip}
ccache_dir=${CCACHE_DIR:-$HOME/.cache/ccache}
suite=bookworm
start=$(date +%s)

fail() {  # one line with the reason and the time so far
  echo "fresh-machine: FAIL ($1) after $(elapsed)" >&2
  exit 1
}
elapsed() {
  local s=$(($(date +%s) - start))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}

[ "$(id -u)" -eq 0 ] || fail "needs root for debootstrap, mount and chroot"
mkdir -p "$cache/debs" "$cache/logs" || fail "cannot create the cache folder $cache"
log="$cache/logs/run-$(date +%Y%m%d-%H%M%S).log"
: >"$log" || fail "cannot write $log"

# Can this machine mount and chroot at all? Ask once, with a tmpfs, before any long work.
probe=$(mktemp -d)
if ! mount -t tmpfs seqpar-probe "$probe" 2>>"$log"; then
  rmdir "$probe"
  fail "this machine forbids mount (mount -t tmpfs failed)"
fi
umount "$probe"
rmdir "$probe"
chroot / true 2>>"$log" || fail "this machine forbids chroot"

# One run at a time per cache folder. A root left by a run killed before its EXIT trap ran (a
# SIGKILL, a lost session: 8 GiB with its mounts still on) has its mounts taken off and is removed
# here; roots kept with --keep are left alone. The lock passes to the run's children, so a root
# whose commands still run is never taken for a stale one.
exec 9>"$cache/.lock"
flock -n 9 || fail "another fresh-machine test is running with $cache (its lock: $cache/.lock)"
for stale in "$cache"/root.*; do
  if [ ! -d "$stale" ] || [ -f "$stale/.kept" ]; then continue; fi
  awk -v r="$stale/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
  if ! grep -q " $stale/" /proc/mounts; then
    echo "fresh-machine: removing $stale, left by an earlier run" >&2
    rm -rf --one-file-system "$stale"
  fi
done

if ! command -v debootstrap >/dev/null; then
  echo "fresh-machine: installing debootstrap" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; } \
    >>"$log" 2>&1 || fail "cannot install debootstrap (log: $log)"
fi

# The pristine root: debootstrap's minbase variant (essential packages and apt, nothing else).
pristine="$cache/pristine-$suite"
if [ "$refresh" -eq 1 ]; then rm -rf "$pristine"; fi
if [ ! -f "$pristine/.complete" ]; then
  echo "fresh-machine: building the pristine $suite root (cached in $pristine)" >&2
  rm -rf "$pristine" "$pristine.tmp"
  debootstrap --variant=minbase --cache-dir="$cache/debs" "$suite" "$pristine.tmp" "$mirror" \
    >>"$log" 2>&1 || fail "debootstrap failed (log: $log)"
  touch "$pristine.tmp/.complete"
  mv "$pristine.tmp" "$pristine"
fi

root=$(mktemp -d "$cache/root.XXXXXX")
mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount -R "${mounts[$i]}" 2>/dev/null || umount -lR "${mounts[$i]}" 2>/dev/null
  done
  if [ "$keep" -eq 1 ]; then
    touch "$root/.kept"
    echo "fresh-machine: root kept at $root" >&2
  else
    # Never delete through a mount that failed to come off.
    if ! grep -q " $root/" /proc/mounts; then rm -rf "$root"; fi
  fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

bind() {  # bind SRC DST-inside-root [rslave]
  mkdir -p "$root$2"
  mount --rbind "$1" "$root$2" 2>>"$log" || fail "cannot bind-mount $1 (log: $log)"
  mount --make-rslave "$root$2" 2>>"$log"
  mounts+=("$root$2")
}

cp -a "$pristine/." "$root/" || fail "cannot copy the pristine root"
rm -f "$root/.complete"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
git clone --quiet "$repo" "$root/root/seqpar" 2>>"$log" || fail "git clone of $repo failed"
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
  echo "fresh-machine: note: uncommitted changes in $repo are not part of the test (HEAD is)" >&2
fi

mkdir -p "$root/proc" "$root/sys"
mount -t proc proc "$root/proc" 2>>"$log" || fail "cannot mount /proc in the root"
mounts+=("$root/proc")
bind /sys /sys
bind /dev /dev
# Downloads are reused between runs; what is installed never is.
bind "$cache/debs" /var/cache/apt/archives
if [ -d "$pip_cache" ]; then bind "$pip_cache" /root/.cache/pip; fi
tools=make
if command -v ccache >/dev/null; then
  mkdir -p "$ccache_dir"
  bind "$ccache_dir" /root/.cache/ccache
  tools="make ccache"
fi

# The network's settings, as the machine's own (not something the project installs).
network_env=()
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
  mkdir -p "$root/etc/ssl/network"
  cp "$PIP_CERT" "$root/etc/ssl/network/ca-bundle.crt"
  network_env+=(PIP_CERT=/etc/ssl/network/ca-bundle.crt)
fi
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
  if [ -n "${!v:-}" ]; then network_env+=("$v=${!v}"); fi
done

in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${network_env[@]}" \
    /bin/bash -c "$1" >>"$log" 2>&1
}

echo "fresh-machine: running in $root (log: $log)" >&2
in_root "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $tools" \
  || fail "installing $tools in the root failed (log: $log)"
# The counts printed at the end are the root's own (the statistics live in the shared cache).
if [ "$tools" != make ]; then in_root 'ccache --zero-stats'; fi
in_root 'cd /root/seqpar && make demo' || fail "make demo failed (log: $log)"
t_demo=$(elapsed)
in_root 'cd /root/seqpar && make test' || fail "make test failed after make demo at $t_demo (log: $log)"
hits=""
if [ "$tools" != make ]; then
  in_root 'ccache --show-stats'
  hits=$(chroot "$root" ccache --print-stats 2>/dev/null |
    awk '$1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { h += $2 }
         $1 == "cache_miss" { m = $2 } END { if (h + m > 0) printf "; ccache %d hits, %d misses", h, m }')
fi
echo "fresh-machine: PASS (Debian 12 minbase + $tools: make demo, make test) in $(elapsed)" \
  "(make demo done at $t_demo$hits; log: $log)"
