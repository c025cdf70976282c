#!/usr/bin/env bash
# Hierarchical `tuned` all_reduce against flat gloo where the network is the limit: two hosts of 2 ranks, each host
# a network namespace, joined by one veth pair whose two ends are shaped with tbf (each end's egress, so both ways).
#
#   sudo benchmarks/netns_bench.sh [RATES] [OUT_DIR] [tunedist.bench arguments...]
#   sudo NETNS_RUNS=3 benchmarks/netns_bench.sh "1gbit 10gbit" netns_out
#
# RATES: tc rates, default "1gbit 10gbit"; "unshaped" leaves the veth without a qdisc. OUT_DIR: default
# netns_bench_out. NETNS_RUNS: runs per rate (default 1). For each rate the script shapes both ends (tbf; tbf_args
# gives burst and latency), then for each run k:
#   1. measures the line rate, TCP goodput one way at a time and then both ways at once, each stream for
#      NETNS_PROBE_S seconds (default 3; netns_linerate.py), into OUT_DIR/<rate>_run<k>.linerate.json;
#   2. counts the bytes an all_reduce of NETNS_WIRE_BYTES (default 16M; 0 skips this step) puts on the veth each
#      way, per backend (netns_wire.py), into <rate>_run<k>.wire.json;
#   3. runs `python -m tunedist.bench --backends tuned,gloo --ops all_reduce -b 1M -e 64M -f 4` into
#      <rate>_run<k>.json, to which it adds a "netns" section (rate, tbf, steps 1 and 2, uptime before and after,
#      qdisc counters, TUNEDIST_* settings); each torchrun's output goes to <rate>_run<k>.node{0,1}.log.
# benchmarks/netns_report.py OUT_DIR prints the comparison with the byte bound.
#
# Namespaces, interfaces and host ids carry this script's PID, so two runs do not collide; the addresses
# 10.77.0.1 (node 0) and 10.77.0.2 (node 1) exist only inside the two namespaces, so no traffic leaves them. The
# rendezvous and gloo (GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME) use those addresses. An EXIT trap kills what the
# script started and deletes the namespaces (with them the veth pair), on success, failure or Ctrl-C.
set -euo pipefail

die() {
  echo "netns_bench.sh: $*" >&2
  exit 2
}

rates=${1:-"1gbit 10gbit"}
out=${2:-netns_bench_out}
shift $(($# < 2 ? $# : 2))
bench_args=("$@")
runs=${NETNS_RUNS:-1}
probe_s=${NETNS_PROBE_S:-3}         # seconds of each line-rate stream
wire_bytes=${NETNS_WIRE_BYTES:-16M} # the all_reduce size of the wire count
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

[[ $(id -u) -eq 0 ]] || die "needs root: it creates network namespaces, a veth pair and tc qdiscs (run with sudo)"
if ! command -v ip > /dev/null || ! ip netns list > /dev/null 2>&1; then
  die "needs 'ip netns' (iproute2, with network namespace support in the kernel): apt-get install iproute2"
fi
command -v tc > /dev/null || die "needs tc (iproute2): apt-get install iproute2"
python3 -c 'import tunedist' 2> /dev/null || die "python3 cannot import tunedist: pip install --no-build-isolation ."
[[ $runs =~ ^[1-9][0-9]*$ ]] || die "NETNS_RUNS must be a positive integer, not '$runs'"

tag=$$
ns=("tdnb${tag}a" "tdnb${tag}b")
dev=("tdv${tag}a" "tdv${tag}b") # interface names: at most 15 characters
addr=(10.77.0.1 10.77.0.2)
port=29500 # free by construction: nothing else listens in a namespace made a moment ago
pgids=()

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pg in "${pgids[@]}"; do
    kill -KILL -- "-$pg" 2> /dev/null || true
  done
  for n in "${ns[@]}"; do
    ip netns del "$n" 2> /dev/null || true # deleting either namespace also deletes the veth pair
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Starts "$@" in its own session (so cleanup can kill its whole process group) inside namespace $1.
in_ns_bg() {
  local n=$1
  shift
  setsid ip netns exec "$n" "$@" &
  pgids+=($!)
}

make_link() {
  for i in 0 1; do
    ip netns add "${ns[i]}"
    ip -n "${ns[i]}" link set lo up
  done
  ip link add "${dev[0]}" type veth peer name "${dev[1]}"
  for i in 0 1; do
    ip link set "${dev[i]}" netns "${ns[i]}"
    ip -n "${ns[i]}" addr add "${addr[i]}/24" dev "${dev[i]}"
    ip -n "${ns[i]}" link set "${dev[i]}" up
  done
}

# tbf parameters for a rate such as 1gbit (bytes/s = bits / 8):
# - burst: the bytes tbf may send at full speed once tokens have piled up. It must exceed the largest packet, which
#   on a veth is a 64 KiB GSO super-packet (a smaller burst makes tbf split them), and hold the tokens that accrue
#   while the dequeue is late: a timer or softirq that fires 2 ms late on this busy 2-core machine would otherwise
#   lose 2 ms of line time. So 2 ms of the rate, at least 256 KiB: 256 KiB at 1 Gbit/s (2.1 ms), 2.5 MB at 10.
#   The price: after the link has idled, up to `burst` bytes pass at unshaped speed. Back-to-back ops leave it idle
#   only between ops, and even a full burst is 1/4 of what a 1 MiB op sends each way, 1/256 of a 64 MiB op's.
# - latency 50ms: the longest a packet may wait in the queue, i.e. a queue of rate x 50 ms (6.25 MB at 1 Gbit/s).
#   Deep enough that TCP does not lose packets to the shaper (the qdisc counters saved with each run would show
#   drops), so the goodput is the rate, not a congestion-control artefact; BBR (this machine's default congestion
#   control) keeps the standing queue short anyway.
tbf_args() {
  local rate=$1 num unit bits
  [[ $rate =~ ^([0-9]+)(kbit|mbit|gbit)$ ]] || die "rate '$rate': use e.g. 500mbit, 1gbit, 10gbit or unshaped"
  num=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case $unit in
    kbit) bits=$((num * 1000)) ;;
    mbit) bits=$((num * 1000000)) ;;
    gbit) bits=$((num * 1000000000)) ;;
  esac
  local burst=$((bits / 8 / 500))
  ((burst >= 262144)) || burst=262144
  echo "rate $rate burst $burst latency 50ms"
}

# What shape() does for a rate, in words saved with each run.
shaping() {
  if [[ $1 == unshaped ]]; then echo "no qdisc"; else echo "tbf $(tbf_args "$1")"; fi
}

shape() {
  local rate=$1
  for i in 0 1; do
    ip netns exec "${ns[i]}" tc qdisc del dev "${dev[i]}" root 2> /dev/null || true
    if [[ $rate != unshaped ]]; then
      # shellcheck disable=SC2046 # tbf_args prints separate words on purpose
      ip netns exec "${ns[i]}" tc qdisc add dev "${dev[i]}" root tbf $(tbf_args "$rate")
    fi
  done
}

qdisc_stats() {
  for i in 0 1; do
    echo "${ns[i]} ${dev[i]}: $(ip netns exec "${ns[i]}" tc -s qdisc show dev "${dev[i]}" | tr '\n' ' ')"
  done
}

# One TCP stream per listed direction (0: node 0 -> node 1, 1: node 1 -> node 0), all at once, for $probe_s s;
# appends the receivers' JSON, comma-separated, to file $1. Not run in a subshell, so cleanup knows every process.
probe() {
  local into=$1 d files=() started=()
  shift
  for d in "$@"; do
    files+=("$into.part$d")
    in_ns_bg "${ns[1 - d]}" python3 "$here/netns_linerate.py" recv "${addr[1 - d]}" $((5300 + d)) > "$into.part$d"
    started+=($!)
  done
  for d in "$@"; do
    in_ns_bg "${ns[d]}" python3 "$here/netns_linerate.py" send "${addr[1 - d]}" $((5300 + d)) "$probe_s" > /dev/null
    started+=($!)
  done
  for d in "${started[@]}"; do wait "$d"; done
  paste -sd, "${files[@]}" | paste -sd, >> "$into"
  rm -f "${files[@]}"
}

# Writes {"node0_to_node1": {...}, "node1_to_node0": {...}, "both_at_once": [{...}, {...}]} to $1.
line_rate() {
  local into=$1
  printf '{"node0_to_node1": ' > "$into"
  probe "$into" 0
  printf ', "node1_to_node0": ' >> "$into"
  probe "$into" 1
  printf ', "both_at_once": [' >> "$into"
  probe "$into" 0 1
  printf ']}\n' >> "$into"
}

# Runs the same worker on both nodes (2 ranks each) and waits for both torchruns.
run_nodes() {
  local log=$1 node started=() is_host=(true false) # node 0 hosts the rendezvous store
  shift
  for node in 0 1; do
    in_ns_bg "${ns[node]}" env TUNEDIST_HOST_ID="${ns[node]}" GLOO_SOCKET_IFNAME="${dev[node]}" \
      TP_SOCKET_IFNAME="${dev[node]}" OMP_NUM_THREADS=1 \
      python3 -m torch.distributed.run --nnodes=2 --node-rank="$node" --nproc-per-node=2 --rdzv-backend=c10d \
      --rdzv-endpoint="${addr[0]}:$port" --rdzv-conf=is_host="${is_host[node]}" \
      --rdzv-id="tunedist-netns-$tag" --max-restarts=0 --local-addr="${addr[node]}" "$@" > "$log.node$node.log" 2>&1
    started+=($!)
  done
  local rc=0
  for p in "${started[@]}"; do wait "$p" || rc=$?; done
  return "$rc"
}

# The first k with no OUT_DIR/<rate>_run<k>.* yet.
next_run() {
  local k=1
  while compgen -G "$out/${1}_run$k.*" > /dev/null; do k=$((k + 1)); done
  echo "$k"
}

# Adds a "netns" section to the bench's JSON $1: the shaping, the line rate and wire counts measured just before,
# the load, the qdisc counters (cumulative since the qdisc was set: drops show there) and any TUNEDIST_* settings.
annotate() {
  RATE=$rate TBF="$(shaping "$rate")" UP0=$up0 UP1=$up1 QDISC="$(qdisc_stats)" BENCH_ARGS="${bench_args[*]}" \
    python3 - "$1" "${1%.json}.linerate.json" "${1%.json}.wire.json" << 'EOF'
import json, os, sys

path, line_path, wire_path = sys.argv[1:]
with open(path) as f:
    rec = json.load(f)
with open(line_path) as f:
    line = json.load(f)
wire = None  # NETNS_WIRE_BYTES=0
if os.path.exists(wire_path):
    with open(wire_path) as f:
        wire = json.load(f)
env = os.environ
rec["netns"] = {"rate": env["RATE"], "tbf": env["TBF"], "line_rate": line, "wire": wire,
                "uptime_before": env["UP0"].strip(), "uptime_after": env["UP1"].strip(),
                "qdisc_after": env["QDISC"].splitlines(), "extra_bench_args": env["BENCH_ARGS"],
                "tunedist_env": {k: v for k, v in env.items() if k.startswith("TUNEDIST_")}}
with open(path, "w") as f:
    json.dump(rec, f, indent=1)
EOF
}

for rate in $rates; do # refuse a bad rate before making anything
  [[ $rate == unshaped ]] || tbf_args "$rate" > /dev/null
done
mkdir -p "$out"
make_link
for rate in $rates; do
  echo "== $rate: $(shaping "$rate")"
  shape "$rate"
  for ((r = 0; r < runs; r++)); do
    k=$(next_run "$rate")
    json="$out/${rate}_run$k.json"
    up0=$(uptime)
    line_rate "${json%.json}.linerate.json"
    echo "line rate (TCP goodput, bytes/s): $(tr -d '\n' < "${json%.json}.linerate.json")"
    if [[ $wire_bytes != 0 ]]; then
      run_nodes "${json%.json}.wire" "$here/netns_wire.py" --bytes "$wire_bytes" --iters 4 \
        --json "${json%.json}.wire.json"
    fi
    run_nodes "${json%.json}" -m tunedist.bench --backends tuned,gloo --ops all_reduce -b 1M -e 64M -f 4 \
      --no-progress --json "$json" "${bench_args[@]}"
    up1=$(uptime)
    annotate "$json"
    grep -h '^# tuned spans\|^#  *size(B)  *op\|^ *[0-9][0-9]*  *all_reduce' "${json%.json}".node?.log || true
    echo "uptime before: $up0"
    echo "uptime after:  $up1"
  done
done
