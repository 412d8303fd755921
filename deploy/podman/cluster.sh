#!/usr/bin/env bash
# A three-node quorumq cluster from the image, on one podman host: a podman network
# "quorumq" whose DNS resolves each container by its name (quorumq-1..3), one named volume per
# node, cluster TLS made by `qq-node certs` inside the image.
#
#   deploy/podman/cluster.sh up [IMAGE]     start (default image localhost/quorumq:dev), wait for /healthz
#   deploy/podman/cluster.sh down           stop the containers (SIGTERM: leaderships handed over)
#   deploy/podman/cluster.sh clean          down, then delete the volumes, network and certificates
#
# Peers are addressed by container name (QQ_PEERS=1=quorumq-1:7101@quorumq-1:7201,...).
# QQ_PEERS_BY_IP=1 uses fixed addresses on the network instead (10.89.34.11-13), for a
# qq-node that does not resolve peer names. Certificates: $QQ_PODMAN_DIR (default
# .qq-podman/ in the repository). Clients: `podman exec quorumq-1 qqctl ...` (guest, over
# loopback inside the container), or the published ports of quorumq-1 on the host:
# 127.0.0.1:7101 (gRPC), 127.0.0.1:5672 (AMQP), 127.0.0.1:7301 (HTTP).
set -euo pipefail
cd "$(dirname "$0")/../.."
action=${1:-up}
image=${2:-localhost/quorumq:dev}
dir=${QQ_PODMAN_DIR:-$PWD/.qq-podman}
net=quorumq
nodes=(1 2 3)
uid=10001 # the image's quorumq user

addr() { # node → host part of its addresses
    if [[ -n ${QQ_PEERS_BY_IP:-} ]]; then echo "10.89.34.1$1"; else echo "quorumq-$1"; fi
}

case $action in
up)
    mkdir -p "$dir"
    podman network exists $net || podman network create --subnet 10.89.34.0/24 $net >/dev/null
    peers=
    for n in "${nodes[@]}"; do
        peers+="${peers:+,}$n=$(addr "$n"):7101@$(addr "$n"):7201"
    done
    for n in "${nodes[@]}"; do
        # The CA (kept in $dir/ca, key included) and node n's certificate, with its name.
        podman run --rm --user 0 -v "$dir:/certs:Z" --entrypoint bash "$image" -c \
            "qq-node certs --ca-dir /certs/ca --out /certs/node$n --name node$n \
                 --host quorumq-$n --host 10.89.34.1$n >/dev/null \
             && chown -R $uid:$uid /certs/node$n"
        podman volume exists "quorumq-$n" || podman volume create "quorumq-$n" >/dev/null
        ports=()
        [[ $n == 1 ]] && ports=(-p 127.0.0.1:7101:7101 -p 127.0.0.1:5672:5672 -p 127.0.0.1:7301:7301)
        podman container exists "quorumq-$n" && podman rm -f "quorumq-$n" >/dev/null
        podman run -d --name "quorumq-$n" --hostname "quorumq-$n" \
            --network $net --ip "10.89.34.1$n" "${ports[@]}" \
            -v "quorumq-$n:/var/lib/quorumq" -v "$dir/node$n:/etc/quorumq/tls:ro,Z" \
            -e QQ_NODE_ID="$n" -e QQ_ADVERTISE="$(addr "$n"):7101" -e QQ_PEERS="$peers" \
            --stop-timeout 60 "$image" >/dev/null
        echo "started quorumq-$n"
    done
    for n in "${nodes[@]}"; do
        for _ in $(seq 120); do
            podman exec "quorumq-$n" qq-healthcheck 2>/dev/null && break
            podman container inspect -f '{{.State.Running}}' "quorumq-$n" | grep -q true || {
                echo "quorumq-$n exited:" >&2; podman logs --tail 20 "quorumq-$n" >&2; exit 1; }
            sleep 1
        done
        podman exec "quorumq-$n" qq-healthcheck || { podman logs --tail 20 "quorumq-$n" >&2; exit 1; }
        echo "quorumq-$n healthy"
    done
    podman exec quorumq-1 qqctl status
    ;;
down)
    for n in "${nodes[@]}"; do podman stop -t 60 "quorumq-$n" 2>/dev/null || true; done
    ;;
clean)
    for n in "${nodes[@]}"; do
        podman rm -f -t 60 "quorumq-$n" >/dev/null 2>&1 || true
        podman volume rm -f "quorumq-$n" >/dev/null 2>&1 || true
    done
    podman network rm -f $net >/dev/null 2>&1 || true
    rm -rf "$dir"
    ;;
*) echo "usage: $0 up [IMAGE] | down | clean" >&2; exit 2 ;;
esac
