#!/usr/bin/env bash
# A two-node Ray cluster on this machine whose "inter-node" link is real and rate-limited.
#
#   sudo benchmarks/two_node_cluster.sh up [RATE]     # RATE: a tc rate, default 100mbit
#   sudo benchmarks/two_node_cluster.sh exec CMD...   # run CMD in node A (the head), e.g. a ddpsweep run
#   sudo benchmarks/two_node_cluster.sh rate RATE     # reshape the running link to RATE (both directions)
#   sudo benchmarks/two_node_cluster.sh down          # stop both Ray nodes, delete both namespaces
#   sudo benchmarks/two_node_cluster.sh demo [RATE]   # up, the scaling sweep of the tiny model, down
#
# Two network namespaces, ddps-a and ddps-b, joined by one veth pair (named ddp0 on both sides) with
# 169.254.77.1 and .2 (link-local, /30: only these two addresses) and no default route: nothing can
# leave the pair. Each end's egress is shaped with tc tbf to RATE, so every byte between the nodes
# crosses a link of known speed, while ranks on the same node talk over their namespace's loopback.
# Node A runs the Ray head, node B a worker node; every rank binds gloo to ddp0, the interface holding its
# node's IP (sweeps.worker.bind), with no GLOO_SOCKET_IFNAME set.
# `up` tears everything down again if any step fails; `down` is safe to run at any time.
# DDPSWEEP_NODE_CORES="0 1" (at `up` and `exec`) pins node A's processes, and what `exec` runs, to core 0 and node
# B's to core 1, as two real nodes share no cores; unset, both nodes float over all of this machine's cores.
set -euo pipefail

NS_A=ddps-a
NS_B=ddps-b
IP_A=169.254.77.1
IP_B=169.254.77.2
GCS_PORT=6379
CPUS=${DDPSWEEP_NODE_CPUS:-2}
TMP_A=/tmp/ddps-na
TMP_B=/tmp/ddps-nb
PY=${PYTHON:-python}
read -r CORE_A CORE_B <<<"${DDPSWEEP_NODE_CORES:-}" || true

in_ns() {
  local ns=$1 core; shift
  core=$([ "$ns" = $NS_A ] && echo "${CORE_A:-}" || echo "${CORE_B:-}")
  ip netns exec "$ns" ${core:+taskset -c "$core"} env RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled "$@"
}

ray_start() {  # ns tmp ray-start-args...
  local ns=$1 tmp=$2; shift 2
  in_ns "$ns" "$PY" -m ray.scripts.scripts start --num-cpus="$CPUS" --object-store-memory=200000000 \
    --temp-dir="$tmp" --disable-usage-stats "$@" >/dev/null
}

down() {
  for ns in $NS_A $NS_B; do
    if ip netns list | grep -qw "$ns"; then
      for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
      ip netns delete "$ns"
    fi
    rm -rf "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null || true
  rm -rf "$TMP_A" "$TMP_B"
}

up() {
  local rate=${1:-100mbit}
  down
  trap 'echo "two_node_cluster: set-up failed, tearing down" >&2; down' ERR
  ip netns add $NS_A
  ip netns add $NS_B
  # `ip netns exec` mounts /etc/netns/<ns>/hosts over /etc/hosts: this host's name resolves to the node's
  # own address in each namespace (Ray finds a driver's node IP through it when there is no route out)
  mkdir -p /etc/netns/$NS_A /etc/netns/$NS_B
  printf '127.0.0.1 localhost\n%s %s\n' $IP_A "$(hostname)" >/etc/netns/$NS_A/hosts
  printf '127.0.0.1 localhost\n%s %s\n' $IP_B "$(hostname)" >/etc/netns/$NS_B/hosts
  ip link add ddps-va type veth peer name ddps-vb
  ip link set ddps-va netns $NS_A
  ip link set ddps-vb netns $NS_B
  ip -n $NS_A link set ddps-va name ddp0
  ip -n $NS_B link set ddps-vb name ddp0
  ip -n $NS_A addr add $IP_A/30 dev ddp0
  ip -n $NS_B addr add $IP_B/30 dev ddp0
  for ns in $NS_A $NS_B; do
    ip -n "$ns" link set lo up
    ip -n "$ns" link set ddp0 up
    # tbf: rate RATE, a burst of 64 KiB, at most 100 ms of queue
    ip netns exec "$ns" tc qdisc add dev ddp0 root tbf rate "$rate" burst 64kb latency 100ms
  done
  ray_start $NS_A $TMP_A --head --node-ip-address=$IP_A --port=$GCS_PORT --include-dashboard=false
  ray_start $NS_B $TMP_B --address=$IP_A:$GCS_PORT --node-ip-address=$IP_B
  in_ns $NS_A "$PY" - <<EOF
import time, ray
ray.init(address="$IP_A:$GCS_PORT", logging_level="ERROR")
for _ in range(60):
    if len([n for n in ray.nodes() if n["Alive"]]) == 2:
        break
    time.sleep(1)
else:
    raise SystemExit("the second node never joined")
EOF
  trap - ERR
  echo "two nodes up: head $IP_A:$GCS_PORT (namespace $NS_A), worker $IP_B ($NS_B), link ddp0 at $rate"
}

run() { in_ns $NS_A "$@"; }

rate() {
  for ns in $NS_A $NS_B; do
    ip netns exec "$ns" tc qdisc change dev ddp0 root tbf rate "$1" burst 64kb latency 100ms
  done
  echo "link ddp0 now at $1"
}

demo() {
  local rate=${1:-100mbit}
  cd "$(dirname "$0")/.."
  DEMO_OUT=$(mktemp -d /tmp/ddps-demo-XXXX)
  trap 'down; rm -rf "$DEMO_OUT"' EXIT
  local out=$DEMO_OUT
  up "$rate"
  run "$PY" -m service.cli run benchmarks/two_node.yaml --cluster "netns-$rate" --address "$IP_A:$GCS_PORT" \
    --results "$out/results"
  echo; echo "== scaling by topology (link: $rate)"
  "$PY" -m service.cli scaling --results "$out/results"
  echo; echo "== all-reduce bus bandwidth at the largest calibrated message (configured link: $rate)"
  "$PY" -m service.cli query --results "$out/results" "select num_nodes, world_size, size_bytes,
    round(median(busbw_gbps) * 8000, 1) as busbw_mbit_s from calibration where kind = 'all_reduce' and
    size_bytes = (select max(size_bytes) from calibration) group by all order by num_nodes"
}

case "${1:-}" in
  up) up "${2:-100mbit}" ;;
  down) down ;;
  rate) rate "$2" ;;
  exec) shift; run "$@" ;;
  demo) demo "${2:-100mbit}" ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
