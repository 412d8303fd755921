#!/usr/bin/env bash
# Builds the quorumq container image from deploy/Containerfile with podman (or docker).
#
#   deploy/build-image.sh                      full multi-stage build (compiles in the image)
#   deploy/build-image.sh --prebuilt DIR       runtime stage only, with DIR/qq-node and DIR/qqctl
#                                              built on the host (e.g. ~/.cache/quorumq/target/release)
#   options: --tag TAG (default localhost/quorumq:dev), --jobs N (cargo -j in the build stage),
#            --extra-ca FILE (a PEM CA the build stage trusts, for an HTTPS-intercepting proxy)
#
# Base image: $BASE_IMAGE, default docker.io/library/debian:bookworm-slim. When that cannot be
# pulled (no registry access), the script makes a Debian bookworm root filesystem with
# mmdebstrap (from the Debian mirror apt uses) and imports it as localhost/quorumq-base:bookworm,
# once; later runs reuse it. Needs root, or podman/mmdebstrap set up for rootless use.
set -euo pipefail
cd "$(dirname "$0")/.."

tag=localhost/quorumq:dev
prebuilt=
jobs=
extra_ca=
while (($#)); do
    case $1 in
        --prebuilt) prebuilt=${2:?--prebuilt DIR}; shift 2 ;;
        --tag) tag=${2:?--tag TAG}; shift 2 ;;
        --jobs) jobs=${2:?--jobs N}; shift 2 ;;
        --extra-ca) extra_ca=${2:?--extra-ca FILE}; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

if [[ -n ${ENGINE:-} ]]; then
    engine=$ENGINE
elif command -v podman >/dev/null; then
    engine=podman
elif docker info >/dev/null 2>&1; then
    engine=docker
else
    echo "build-image.sh: neither podman nor a running docker daemon (apt-get install podman)" >&2
    exit 1
fi

image_exists() { $engine image inspect "$1" >/dev/null 2>&1; } # podman and docker alike
base=${BASE_IMAGE:-docker.io/library/debian:bookworm-slim}
local_base=localhost/quorumq-base:bookworm
if image_exists "$base" || $engine pull -q "$base" >/dev/null 2>&1; then
    echo "base image: $base"
elif image_exists "$local_base"; then
    echo "base image: $base cannot be pulled; using $local_base (made earlier by this script)"
    base=$local_base
else
    echo "base image: $base cannot be pulled; making $local_base with mmdebstrap"
    command -v mmdebstrap >/dev/null || { echo "build-image.sh: apt-get install mmdebstrap" >&2; exit 1; }
    tmp=$(mktemp -d)
    # minbase (essential packages, apt, bash) plus CA certificates; no docs, man pages or
    # locales, no apt lists: what debian:bookworm-slim leaves out too.
    mmdebstrap --variant=minbase --include=ca-certificates \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
        bookworm "$tmp/rootfs.tar" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
    $engine import --change 'CMD ["/bin/bash"]' "$tmp/rootfs.tar" "$local_base" >/dev/null
    rm -rf "$tmp"
    base=$local_base
fi

args=(build --format docker -f deploy/Containerfile --build-arg "BASE_IMAGE=$base" -t "$tag")
[[ $engine == docker ]] && args=(build -f deploy/Containerfile --build-arg "BASE_IMAGE=$base" -t "$tag")
[[ -n $jobs ]] && args+=(--build-arg "JOBS=$jobs")
cleanup_context() { rm -rf deploy/.bin deploy/container/ca/extra-ca.crt; }
trap cleanup_context EXIT
if [[ -n $prebuilt ]]; then
    for bin in qq-node qqctl; do
        [[ -x $prebuilt/$bin ]] || { echo "build-image.sh: $prebuilt/$bin not found" >&2; exit 1; }
    done
    rm -rf deploy/.bin && mkdir -p deploy/.bin
    cp "$prebuilt/qq-node" "$prebuilt/qqctl" deploy/.bin/
    args+=(--target runtime-prebuilt)
fi
[[ -n $extra_ca ]] && cp "$extra_ca" deploy/container/ca/extra-ca.crt
$engine "${args[@]}" .
echo "built $tag"
$engine image ls "$tag"
