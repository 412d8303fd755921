#!/usr/bin/env bash
# The cluster CA and the node certificate for the Kubernetes manifests, as the Secret
# quorumq-tls (ca.pem, node.pem, node.key) that statefulset.yaml mounts.
#
#   deploy/kubernetes/make-certs.sh [NAMESPACE] [MAX_REPLICAS]      (defaults: quorumq, 5)
#   kubectl apply -n NAMESPACE -f .qq-k8s/NAMESPACE/quorumq-tls.yaml
#
# One certificate serves every pod (`qq-node certs`: ECDSA P-256, EKU server and client auth).
# Nodes check each other's SAN "qq-node" (always present); clients check the name they dial,
# so its SANs are the client service (quorumq, quorumq.NAMESPACE, quorumq.NAMESPACE.svc and
# .svc.cluster.local) and every pod name up to MAX_REPLICAS (quorumq-N.quorumq-headless.
# NAMESPACE.svc and .svc.cluster.local), so scaling up to MAX_REPLICAS needs no new
# certificate. The CA's key stays in .qq-k8s/NAMESPACE/ca (keep it safe; it is reused on
# the next run, which then only replaces the node certificate): it never goes into the Secret.
#
# qq-node: $QQ_NODE_BIN, else qq-node on PATH, else $CARGO_TARGET_DIR/debug/qq-node
# (default ~/.cache/quorumq/target); with QQ_IMAGE=IMAGE, `podman run IMAGE certs` instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
ns=${1:-quorumq}
max=${2:-5}
out=.qq-k8s/$ns
mkdir -p "$out"

hosts=(quorumq "quorumq.$ns" "quorumq.$ns.svc" "quorumq.$ns.svc.cluster.local"
       "quorumq-headless.$ns.svc" "quorumq-headless.$ns.svc.cluster.local")
for ((i = 0; i < max; i++)); do
    hosts+=("quorumq-$i.quorumq-headless.$ns.svc" "quorumq-$i.quorumq-headless.$ns.svc.cluster.local")
done
host_args=()
for h in "${hosts[@]}"; do host_args+=(--host "$h"); done

if [[ -n ${QQ_IMAGE:-} ]]; then
    podman run --rm --user 0 -v "$PWD/$out:/certs:Z" "$QQ_IMAGE" certs \
        --ca-dir /certs/ca --out /certs/node --name quorumq --force "${host_args[@]}"
else
    bin=${QQ_NODE_BIN:-$(command -v qq-node || echo "${CARGO_TARGET_DIR:-$HOME/.cache/quorumq/target}/debug/qq-node")}
    [[ -x $bin ]] || { echo "make-certs.sh: no qq-node ($bin); set QQ_NODE_BIN or QQ_IMAGE" >&2; exit 1; }
    "$bin" certs --ca-dir "$out/ca" --out "$out/node" --name quorumq --force "${host_args[@]}"
fi

secret=$out/quorumq-tls.yaml
{
    echo "# Made by deploy/kubernetes/make-certs.sh $ns $max: cluster CA, node certificate and key."
    echo "apiVersion: v1"
    echo "kind: Secret"
    echo "metadata:"
    echo "  name: quorumq-tls"
    echo "  labels:"
    echo "    app.kubernetes.io/name: quorumq"
    echo "type: Opaque"
    echo "data:"
    for f in ca.pem node.pem node.key; do
        echo "  $f: $(base64 -w0 "$out/node/$f")"
    done
} >"$secret"
chmod 600 "$secret"
echo "wrote $secret; apply it with: kubectl apply -n $ns -f $secret"
