#!/bin/bash
# Before this node is stopped (Kubernetes preStop, or by hand before `podman stop`): wait until
# stopping it breaks no queue's majority (`qqctl check-quorum-critical`), for at most
# QQ_PRESTOP_TIMEOUT_S seconds (default 120), then return; the SIGTERM that follows makes the
# node hand its leaderships over and exit. Returns 0 either way (a preStop that fails is only
# logged); on timeout it says so on stderr, and the pod stops regardless (as a drain would).
#
# Node id: QQ_NODE_ID, else the ordinal after the last '-' of the host name + 1 (quorumq-0 is
# node 1, as QQ_NODE_ID_FROM_HOSTNAME). The client port is asked over loopback as guest; when
# it serves TLS (QQ_TLS_CERT set), over https with the cluster CA.
id=${QQ_NODE_ID:-}
if [[ -z $id ]]; then
    ordinal=${HOSTNAME##*-}
    [[ $ordinal =~ ^[0-9]+$ ]] || { echo "prestop: no node id (QQ_NODE_ID, or a host name ending in -N)" >&2; exit 0; }
    id=$((ordinal + 1))
fi
port=${QQ_LISTEN##*:}
port=${port:-7101}
ctl=(qqctl --node "127.0.0.1:$port")
[[ -n ${QQ_TLS_CERT:-} ]] && ctl=(qqctl --node "https://127.0.0.1:$port" --ca "${QQ_CLUSTER_CA:-/etc/quorumq/tls/ca.pem}")
deadline=$((SECONDS + ${QQ_PRESTOP_TIMEOUT_S:-120}))
until out=$("${ctl[@]}" check-quorum-critical "$id" 2>&1); do
    if ((SECONDS >= deadline)); then
        echo "prestop: node $id is still quorum-critical after ${QQ_PRESTOP_TIMEOUT_S:-120} s; stopping anyway: $out" >&2
        exit 0
    fi
    sleep 2
done
echo "prestop: node $id is not quorum-critical; stopping"
