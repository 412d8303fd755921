"""What the Kubernetes API schemas cannot see in deploy/kubernetes/*.yaml: names that must agree
across objects and settings the cluster relies on. Part of `make deploy-check`, after
kubernetes-validate; prints every problem and exits 1 if there is one.

    python3 deploy/kubernetes/check.py deploy/kubernetes/*.yaml
"""

import re
import sys

import yaml  # PyYAML, installed with kubernetes-validate


def main(paths):
    objs = [o for p in paths for o in yaml.safe_load_all(open(p)) if o]
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    problems = []
    (sts,) = by_kind["StatefulSet"]
    spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    (node,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in node["ports"]}
    env = {e["name"]: e.get("value") for e in node["env"]}

    def need(ok, what):
        if not ok:
            problems.append(what)

    need(spec["podManagementPolicy"] == "Parallel", "StatefulSet: podManagementPolicy must be Parallel")
    services = {s["metadata"]["name"]: s for s in by_kind["Service"]}
    headless = services.get(spec["serviceName"])
    need(headless is not None, f"StatefulSet: serviceName {spec['serviceName']} is no Service here")
    if headless:
        need(headless["spec"].get("clusterIP") == "None", "headless Service: clusterIP must be None")
        need(headless["spec"].get("publishNotReadyAddresses") is True,
             "headless Service: publishNotReadyAddresses must be true (peers resolve before ready)")
    for name, svc in services.items():
        sel = svc["spec"]["selector"]
        need(all(labels.get(k) == v for k, v in sel.items()), f"Service {name}: selector matches no pod label")
        for p in svc["spec"]["ports"]:
            t = p["targetPort"]
            need(t in ports or t in ports.values(), f"Service {name}: targetPort {t} is no container port")
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = node.get(kind, {}).get("httpGet", {})
        need(get.get("path") == "/healthz", f"{kind}: must GET /healthz")
        need(ports.get(get.get("port")) == 7301, f"{kind}: port must be the http port 7301")
    annotations = sts["spec"]["template"]["metadata"].get("annotations", {})
    need(annotations.get("prometheus.io/port") == str(ports.get("http")),
         "prometheus.io/port must be the http container port")
    need("preStop" in node.get("lifecycle", {}), "qq-node: no preStop hook")
    need(pod.get("terminationGracePeriodSeconds", 30) > int(env.get("QQ_PRESTOP_TIMEOUT_S") or 0),
         "terminationGracePeriodSeconds must exceed QQ_PRESTOP_TIMEOUT_S (then the SIGTERM handover)")
    # Every listener's port is a container port; QQ_PEERS names each replica's pod once.
    for var, port in [("QQ_LISTEN", "grpc"), ("QQ_CLUSTER_ADDR", "cluster"), ("QQ_HTTP_ADDR", "http"),
                      ("QQ_AMQP_ADDR", "amqp"), ("QQ_AMQPS_ADDR", "amqps")]:
        need((env.get(var) or "").endswith(f":{ports.get(port)}"), f"{var} must listen on the {port} port")
    peers = (env.get("QQ_PEERS") or "").split(",")
    want = [f"{i + 1}={sts['metadata']['name']}-{i}.{spec['serviceName']}." for i in range(spec["replicas"])]
    need(len(peers) == spec["replicas"] and all(p.startswith(w) for p, w in zip(peers, want)),
         f"QQ_PEERS must list {spec['replicas']} nodes as id=POD.{spec['serviceName']}...: {peers}")
    need(all(re.fullmatch(r"\d+=[^@,]+:7101@[^@,]+:7201", p) for p in peers), "QQ_PEERS: id=host:7101@host:7201")
    mounts = {m["name"] for m in node["volumeMounts"]}
    vols = {v["name"] for v in pod["volumes"]} | {c["metadata"]["name"] for c in spec["volumeClaimTemplates"]}
    need(mounts <= vols, f"volumeMounts {sorted(mounts - vols)} have no volume")
    (pdb,) = by_kind["PodDisruptionBudget"]
    need(pdb["spec"].get("maxUnavailable") == 1, "PodDisruptionBudget: maxUnavailable must be 1")
    need(all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items()),
         "PodDisruptionBudget: selector matches no pod label")
    for p in problems:
        print(f"deploy/kubernetes: {p}", file=sys.stderr)
    print(f"deploy/kubernetes: {len(objs)} objects, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
