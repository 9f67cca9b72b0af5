#!/usr/bin/env bash
# Bring up a real Slurm 22.05 test cluster on this host (one node, or more), without systemd:
# munged, a private MariaDB on 127.0.0.1:$DB_PORT, slurmdbd, slurmctld and slurmd
# (node "localhost", partition "debug", 2 fake GPUs). Idempotent: returns in well
# under a second when the cluster is already up and healthy. Must run as root.
#
#   bash slurm/up.sh              the single-node cluster
#   bash slurm/up.sh --nodes 2    plus nodes grpo-n1, grpo-n2 (partition "multi"), each slurmd
#                                 in its own network namespace on the bridge grpo-br0
#   (--nodes 1 after --nodes 2 removes the extra nodes again)
#   bash slurm/up.sh --real-gpus  declare this host's NVIDIA GPUs (nvidia-smi) instead of the
#                                 fake ones: gres.conf File=/dev/nvidiaN, Gres=gpu:<count>
#   bash slurm/up.sh [--real-gpus] --print-config
#                                 print the slurm.conf and gres.conf it would write; no root
#                                 needed, changes nothing
#
# Environment (all optional):
#   GRPO_SLURM_STATE    state dir (default /var/lib/grpo-slurm: DB, spool, logs, pids)
#   GRPO_SLURM_GPUS     number of fake GPUs (default 2)
#   GRPO_SLURM_DB_PORT  MariaDB TCP port on 127.0.0.1 (default 3307)
#   GRPO_SLURM_MEM      RealMemory in MB (default: 90% of MemTotal)
#   GRPO_SLURM_WAIT     seconds to wait for the node to be idle (default 60)
#   GRPO_SLURM_NODES    default for --nodes (1)
#   GRPO_SLURM_SUBNET   first three octets of the multi-node /24 (default 10.213.7)
#   GRPO_SLURM_REAL_GPUS=1  the same as --real-gpus
#   GRPO_SLURM_LO_ADDR  address given to lo on a host with no IPv4 address but 127.0.0.1
#                       (default 10.213.6.1)
#   GRPO_SLURM_CGROUP   auto (default): with --real-gpus, on cgroup v2 and no systemd (a VM or
#                       container without dbus: slurmd 22.05 asks systemd for its stepd
#                       scope and dies without it) `hide`; elsewhere, and always without
#                       --real-gpus (the CPU test cluster), `none` (as before).
#                       hide: slurmd in a mount namespace that sees only a named cgroup v1
#                       hierarchy (what the CI containers have; ran on the lent GPU VM);
#                       nosystemd: cgroup.conf IgnoreSystemd=yes (not yet seen working)
#   GRPO_SLURM_DEBS     a folder of .debs (slurm/offline-debs.sh) to install from when the
#                       packages are missing, on a machine without a package registry
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm/lib.sh
source "$HERE/lib.sh"
# shellcheck source=slurm/gpus.sh
source "$HERE/gpus.sh"

NODES=${GRPO_SLURM_NODES:-1}
REAL_GPUS=${GRPO_SLURM_REAL_GPUS:-0}
PRINT_CONFIG=0
while (($#)); do
    case "$1" in
    --nodes) NODES=${2:-} && shift 2 || { echo "slurm/up.sh: --nodes needs a number" >&2; exit 2; } ;;
    --nodes=*) NODES=${1#--nodes=} && shift ;;
    --real-gpus) REAL_GPUS=1 && shift ;;
    --print-config) PRINT_CONFIG=1 && shift ;;
    -h | --help) sed -n '2,28s/^# \{0,1\}//p' "$0" && exit 0 ;;
    *) echo "slurm/up.sh: unknown argument '$1' (see --help)" >&2 && exit 2 ;;
    esac
done
[[ $NODES =~ ^[1-9]$ ]] || { echo "slurm/up.sh: --nodes must be 1..9 (got '$NODES')" >&2; exit 2; }
WAIT=${GRPO_SLURM_WAIT:-60}
LOG="$STATE/log"
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
# what the offline install (GRPO_SLURM_DEBS) must provide; dpkg does not know those files
COMMANDS=(slurmctld slurmd slurmstepd sbatch srun sacct slurmdbd munged mungekey mariadbd
    mariadb-install-db mariadb-admin ip)

die() {
    # die WHAT... [LOGFILE]: one line saying what failed and where its log is (last argument
    # if it names a file), then the tail of that log.
    trap - ERR
    local log=""
    if (($# > 1)) && [[ ${!#} == /* ]]; then
        log=${!#}
        set -- "${@:1:$#-1}"
    fi
    echo "slurm/up.sh: FAILED: $*${log:+ -- log: $log}" >&2
    if [[ -n $log && -r $log ]]; then
        echo "---- last lines of $log ----" >&2
        tail -n 15 "$log" >&2 || true
    fi
    exit 1
}
trap 'die "command failed at line $LINENO: $BASH_COMMAND"' ERR

# ---------------------------------------------------------------- config rendering
node_cpus() {
    # The CPUs this host may use. Not plain nproc: GNU nproc honours OMP_NUM_THREADS and
    # OMP_THREAD_LIMIT, and the test suite exports OMP_NUM_THREADS=1, so the conftest's call
    # of up.sh rendered CPUs=1, "changed" the config and restarted every daemon: the suite
    # then ran on one CPU slot per node (jobs meant to run side by side queued instead).
    env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc
}
node_mem() {
    if [[ -n ${GRPO_SLURM_MEM:-} ]]; then
        echo "$GRPO_SLURM_MEM"
        return
    fi
    # 90% of MemTotal: stable across runs (so the config does not churn) and below what
    # slurmd detects, which would otherwise drain the node with "Low RealMemory".
    awk '/^MemTotal:/ { printf "%d\n", $2 / 1024 * 0.9 }' /proc/meminfo
}
gpu_files() {
    if ((NGPU == 1)); then echo /dev/fakegpu0; else echo "/dev/fakegpu[0-$((NGPU - 1))]"; fi
}
gpu_devices() {
    # the device files of the GPUs slurmd hands out: /dev/nvidiaN (--real-gpus) or fake ones
    if ((REAL_GPUS)); then
        printf '%s\n' "$GRES_CONF" | sed -n 's|^NodeName=.* File=||p'
    else
        local i
        for ((i = 0; i < NGPU; i++)); do echo "/dev/fakegpu$i"; done
    fi
}
db_pass() {
    local f="$STATE/db.pass"
    if [[ ! -s $f ]]; then
        mkdir -p "$STATE"
        (
            umask 077
            tr -dc 'A-Za-z0-9' </dev/urandom 2>/dev/null | head -c 24 >"$f" || true
        )
    fi
    cat "$f"
}
render() {
    # render TEMPLATE -> stdout (slurm.conf gets the multi-node changes when NODES > 1;
    # gres.conf lists the real GPUs with --real-gpus)
    if [[ $1 == gres.conf.in ]] && ((REAL_GPUS)); then
        printf '%s\n' "$GRES_CONF"
    elif [[ $1 == slurm.conf.in ]] && ((NODES > 1)); then
        render_plain "$1" | multi_node_conf
    else
        render_plain "$1"
    fi
}
multi_node_conf() {
    # The single-node slurm.conf on stdin -> the multi-node one: slurmctld reachable from the
    # namespaces at $HOST_ADDR, one pid/spool/log per slurmd (%n = node name), a short
    # SlurmdTimeout so a dead node is DOWN (its job NODE_FAIL) within ~15 s, and the nodes.
    # (SlurmdTimeout=10: slurmctld pings every 3 s; a stopped slurmd's ping fails after
    # MessageTimeout=5 s. With 20 and 10 the test's dead node took ~33 s on the loaded machine.)
    # The new nodes come *before* localhost: while a node named localhost is the only one
    # defined, Slurm's node lookup returns it for any name (and then rejects the next node).
    local i names=() nodes
    nodes="# Multi-node mode (up.sh --nodes $NODES): one slurmd per network namespace."
    for ((i = 1; i <= NODES; i++)); do
        names+=("$(node_name "$i")")
        nodes+=$'\n'"NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i")"
        nodes+=" NodeHostname=$(node_name "$i") CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"
    done
    sed -e "s|^SlurmctldHost=localhost\$|SlurmctldHost=localhost($HOST_ADDR)|" \
        -e "s|^SlurmdPidFile=\(.*\)/slurmd.pid\$|SlurmdPidFile=\1/slurmd-%n.pid|" \
        -e "s|^SlurmdSpoolDir=\(.*\)/slurmd\$|SlurmdSpoolDir=\1/slurmd-%n|" \
        -e "s|^SlurmdLogFile=\(.*\)/slurmd.log\$|SlurmdLogFile=\1/slurmd-%n.log|" \
        -e "s|^SlurmdTimeout=.*|SlurmdTimeout=10|" |
        awk -v nodes="$nodes" '/^NodeName=localhost / { print nodes } { print }'
    local IFS=,
    echo "PartitionName=multi Nodes=${names[*]} Default=NO MaxTime=INFINITE State=UP"
}
render_plain() {
    sed -e "s|@STATE@|$STATE|g" -e "s|@CLUSTER@|$CLUSTER|g" -e "s|@CPUS@|$CPUS|g" \
        -e "s|@MEM@|$MEM|g" -e "s|@NGPU@|$NGPU|g" -e "s|@GPU_FILES@|$GPU_FILES|g" \
        -e "s|@DB_PORT@|$DB_PORT|g" -e "s|@DB_USER@|$DB_USER|g" -e "s|@DB_PASS@|$DB_PASS|g" \
        "$HERE/$1"
}

if ((REAL_GPUS)); then
    command -v nvidia-smi >/dev/null || die "--real-gpus: nvidia-smi not found"
    smi=$(nvidia-smi -q 2>&1) || die "--real-gpus: nvidia-smi -q failed: ${smi##*$'\n'}"
    GRES_CONF=$(render_gres_conf_real localhost <<<"$smi")
    NGPU=$(grep -c '^NodeName=' <<<"$GRES_CONF" || true)
    ((NGPU > 0)) || die "--real-gpus: nvidia-smi -q lists no GPU"
fi
[[ $NGPU =~ ^[1-9][0-9]*$ ]] || die "GRPO_SLURM_GPUS must be a number >= 1 (got '$NGPU')"
CPUS=$(node_cpus)
MEM=$(node_mem)
GPU_FILES=$(gpu_files)
if ((PRINT_CONFIG)); then
    DB_PASS='<db.pass>'
    for f in slurm.conf gres.conf; do
        echo "==> $CONF_DIR/$f <=="
        render "$f.in"
    done
    exit 0
fi
[[ $EUID -eq 0 ]] || die "must run as root (it starts munged, MariaDB and the Slurm daemons)"

configs_current() {
    [[ -r $STATE/db.pass ]] || return 1
    DB_PASS=$(<"$STATE/db.pass")
    local f
    for f in slurm.conf gres.conf slurmdbd.conf; do
        [[ $(render "$f.in") == "$(cat "$CONF_DIR/$f" 2>/dev/null)" ]] || return 1
    done
    if [[ $CGROUP == nosystemd ]]; then
        [[ $(cgroup_conf) == "$(cat "$CONF_DIR/cgroup.conf" 2>/dev/null)" ]] || return 1
    else
        ! grep -qs "$MARKER" "$CONF_DIR/cgroup.conf" || return 1
    fi
}

# ---------------------------------------------------------------- cgroups
cgroup_mode() {
    local mode=${GRPO_SLURM_CGROUP:-auto}
    if [[ $mode == auto ]]; then
        # Only for the real-GPU node (the lent GPU VM, where slurmd otherwise dies): the CPU
        # test cluster of CI keeps running exactly as before, whatever its cgroups are.
        mode=none
        if ((REAL_GPUS)) && [[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) == cgroup2fs ]] &&
            [[ ! -d /run/systemd/system ]]; then
            mode=hide
        fi
    fi
    case $mode in
    none | nosystemd | hide) echo "$mode" ;;
    *) die "GRPO_SLURM_CGROUP must be auto, none, nosystemd or hide (got '$mode')" ;;
    esac
}
cgroup_conf() {
    echo "# $MARKER (GRPO_SLURM_CGROUP=nosystemd) -- do not edit here."
    echo "# cgroup v2 without systemd: slurmd 22.05 asks systemd (dbus) for the scope of its"
    echo "# slurmstepds and fails to start without it; IgnoreSystemd makes the scope itself."
    echo "# Nothing is constrained (TaskPlugin=task/none, ProctrackType=proctrack/linuxproc)."
    echo "CgroupPlugin=cgroup/v2"
    echo "IgnoreSystemd=yes"
}
CGROUP=$(cgroup_mode)

# ---------------------------------------------------------------- fast path
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
node_state() { sinfo -h -N -n "${1:-localhost}" -o %t 2>/dev/null | head -n 1; }
all_nodes() {
    local i
    echo localhost
    for ((i = 1; i <= NODES && NODES > 1; i++)); do node_name "$i"; done
}
slurmd_names() {
    # the slurmd daemons of this mode, as pidfile_of names them
    local i
    if ((NODES == 1)); then echo slurmd && return; fi
    echo slurmd@localhost
    for ((i = 1; i <= NODES; i++)); do echo "slurmd@$(node_name "$i")"; done
}
node_up() { case "$(node_state "$1")" in idle | mix | alloc | comp) ;; *) return 1 ;; esac; }

healthy() {
    local d
    for d in mariadbd slurmdbd slurmctld $(slurmd_names); do alive "$d" || return 1; done
    munge_ok || return 1
    for d in $(gpu_devices); do [[ -e $d ]] || return 1; done
    configs_current || return 1
    for d in $(all_nodes); do node_up "$d" || return 1; done
    sacct -n -X -o JobID >/dev/null 2>&1 || return 1
}

take_lock # fd 9; every daemon below is started with 9>&- so it does not inherit the lock
if command -v sinfo >/dev/null && healthy; then
    echo "slurm: cluster already up ($NODES node(s): $(all_nodes | while read -r n; do
        printf '%s %s ' "$n" "$(node_state "$n")"
    done)cluster $CLUSTER)"
    exit 0
fi

T0=$SECONDS

# ---------------------------------------------------------------- packages
missing=()
if [[ -n ${GRPO_SLURM_DEBS:-} ]]; then
    for c in "${COMMANDS[@]}"; do command -v "$c" >/dev/null || missing+=("$c"); done
    if ((${#missing[@]})); then
        echo "slurm: installing from $GRPO_SLURM_DEBS (missing: ${missing[*]})"
        mkdir -p "$LOG"
        bash "$HERE/offline-install.sh" "$GRPO_SLURM_DEBS" >"$LOG/offline-install.log" 2>&1 ||
            die "offline install from $GRPO_SLURM_DEBS" "$LOG/offline-install.log"
        tail -n 1 "$LOG/offline-install.log"
        missing=()
    fi
fi
for p in "${PACKAGES[@]}"; do
    [[ -z ${GRPO_SLURM_DEBS:-} ]] || break
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) == "install ok installed" ]] ||
        missing+=("$p")
done
if ((${#missing[@]})); then
    echo "slurm: installing ${missing[*]}"
    mkdir -p "$LOG"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends "${missing[@]}" >"$LOG/apt.log" 2>&1; then
        { apt-get update && apt-get install -y --no-install-recommends "${missing[@]}"; } \
            >>"$LOG/apt.log" 2>&1 || die "apt-get install ${missing[*]}" "$LOG/apt.log"
    fi
fi

getent hosts localhost >/dev/null ||
    die "the name localhost does not resolve: add '127.0.0.1 localhost' to /etc/hosts"

# Slurm 22.05 binds its ports through getaddrinfo(AF_INET, AI_ADDRCONFIG), which finds nothing
# on a host whose only IPv4 address is 127.0.0.1 (an offline VM, a bare network namespace):
# every daemon then dies with 'Unable to resolve "(null)"'. Such a host gets one private
# address on lo ($LO_ADDR/32, GRPO_SLURM_LO_ADDR), which reaches nothing outside it.
LO_ADDR=${GRPO_SLURM_LO_ADDR:-10.213.6.1}
ipv4_addrs() {
    { ip -4 -o addr show 2>/dev/null | awk '{ sub(/\/.*/, "", $4); print $4 }'
        hostname -I 2>/dev/null | tr ' ' '\n'; } | grep -E '^[0-9]+\.' | grep -v '^127\.' || true
}
if [[ -z $(ipv4_addrs) ]]; then
    command -v ip >/dev/null ||
        die "this host has no IPv4 address besides 127.0.0.1 (Slurm's daemons need one) and" \
            "no 'ip' command to add one"
    ip addr add "$LO_ADDR/32" dev lo || die "ip addr add $LO_ADDR/32 dev lo (needs CAP_NET_ADMIN)"
    echo "slurm: no IPv4 address besides 127.0.0.1: added $LO_ADDR/32 to lo (Slurm needs one)"
fi

# ---------------------------------------------------------------- dirs, fake GPUs, configs
mkdir -p "$STATE"/{run,log,spool/slurmctld,spool/slurmd} "$CONF_DIR"
chmod 755 "$STATE"
DB_PASS=$(db_pass)
[[ -n $DB_PASS ]] || die "could not create $STATE/db.pass"

for dev in $(gpu_devices); do
    if ((REAL_GPUS)); then
        [[ -c $dev ]] || die "--real-gpus: $dev (from nvidia-smi -q) is not a character device"
        continue
    fi
    [[ -c $dev ]] && continue
    rm -f "$dev"
    # Same device numbers as /dev/null: harmless to open, but a distinct file per GPU.
    mknod -m 666 "$dev" c 1 3 || die "mknod $dev (needs CAP_MKNOD)"
done

changed_slurm=0
changed_dbd=0
write_conf() {
    # write_conf NAME MODE FLAGVAR: (re)write $CONF_DIR/NAME; set FLAGVAR=1 if it changed
    local name=$1 mode=$2 flag=$3 dst="$CONF_DIR/$1" tmp
    tmp=$(mktemp "$CONF_DIR/.$name.XXXXXX")
    render "$name.in" >"$tmp"
    chmod "$mode" "$tmp"
    chown root:root "$tmp"
    if [[ -f $dst ]] && cmp -s "$tmp" "$dst"; then
        rm -f "$tmp"
        chmod "$mode" "$dst"
        return 0
    fi
    if [[ -f $dst ]] && ! grep -q "$MARKER" "$dst"; then
        local bak
        bak="$dst.orig.$(date +%Y%m%d%H%M%S)"
        cp -p "$dst" "$bak"
        echo "slurm: existing $dst was not generated by up.sh; saved it as $bak"
    fi
    mv -f "$tmp" "$dst"
    printf -v "$flag" 1
}
write_conf slurm.conf 644 changed_slurm
write_conf gres.conf 644 changed_slurm
write_conf slurmdbd.conf 600 changed_dbd
if [[ $CGROUP == nosystemd ]]; then
    if [[ $(cgroup_conf) != "$(cat "$CONF_DIR/cgroup.conf" 2>/dev/null)" ]]; then
        if [[ -f $CONF_DIR/cgroup.conf ]] && ! grep -q "$MARKER" "$CONF_DIR/cgroup.conf"; then
            cp -p "$CONF_DIR/cgroup.conf" "$CONF_DIR/cgroup.conf.orig.$(date +%Y%m%d%H%M%S)"
        fi
        cgroup_conf >"$CONF_DIR/cgroup.conf"
        changed_slurm=1
    fi
    # slurmd makes its scope with mkdir, not mkdir -p: on the GPU VM it failed on the missing
    # parent ("Could not create scope directory .../system.slice/localhost_slurmstepd.scope")
    mkdir -p /sys/fs/cgroup/system.slice
elif grep -qs "$MARKER" "$CONF_DIR/cgroup.conf"; then
    rm -f "$CONF_DIR/cgroup.conf" # ours, from a run in another mode
    changed_slurm=1
fi

log_of() {
    case "$1" in
    munged) echo /var/log/munge/munged.log ;;
    slurmd@*) echo "$LOG/slurmd-${1#slurmd@}.log" ;;
    *) echo "$LOG/$1.log" ;;
    esac
}

# launch NAME CMD...: run a self-daemonizing daemon (without the lock fd 9 and with stdio
# off any pipe of our caller), then wait until its pid file names a live process.
launch() {
    local name=$1 i
    shift
    "$@" 9>&- </dev/null >>"$LOG/$name.out" 2>&1 || die "start $name" "$(log_of "$name")"
    for ((i = 0; i < 100; i++)); do
        alive "$name" && return 0
        sleep 0.1
    done
    die "$name did not start (no live pid in $(pidfile_of "$name"))" "$(log_of "$name")"
}

# wait_for DAEMON SECONDS CMD...: poll CMD until it succeeds or DAEMON exits or time is up.
wait_for() {
    local name=$1 timeout=$2 t0=$SECONDS
    shift 2
    until "$@" >/dev/null 2>&1; do
        alive "$name" || die "$name exited" "$(log_of "$name")"
        ((SECONDS - t0 < timeout)) || return 0
        sleep 0.1
    done
}

# ---------------------------------------------------------------- multi-node network
setup_network() {
    # The bridge with the host's address, then one namespace + veth pair per node.
    local route
    route=$(ip -4 route show "$SUBNET.0/24" 2>/dev/null || true)
    if [[ -n $route && $route != *"dev $BRIDGE"* ]]; then
        die "subnet $SUBNET.0/24 is already routed ($route): set GRPO_SLURM_SUBNET to a free /24"
    fi
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge || die "ip link add $BRIDGE type bridge (needs CAP_NET_ADMIN)"
    fi
    ip -4 addr show dev "$BRIDGE" | grep -q "inet $HOST_ADDR/" ||
        ip addr add "$HOST_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local i
    for ((i = 1; i <= NODES; i++)); do setup_node "$i"; done
}

setup_node() {
    local i=$1 ns addr veth
    ns=$(node_name "$i") addr=$(node_addr "$i") veth=grpo-v$i
    mkdir -p "/etc/netns/$ns"
    {
        echo "# Generated by grpo_hpc slurm/up.sh: /etc/hosts inside namespace $ns"
        echo "127.0.0.1 localhost"
        echo "$HOST_ADDR grpo-ctl"
        for ((j = 1; j <= NODES; j++)); do echo "$(node_addr "$j") $(node_name "$j")"; done
    } >"/etc/netns/$ns/hosts"
    if ip netns exec "$ns" ip -4 addr show dev eth0 2>/dev/null | grep -q "inet $addr/"; then
        return 0
    fi
    ip netns delete "$ns" 2>/dev/null || true # half-made by an interrupted run
    ip link delete "$veth" 2>/dev/null || true
    ip netns add "$ns" || die "ip netns add $ns (needs CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    ip link add "$veth" type veth peer name eth0 netns "$ns" || die "ip link add $veth type veth"
    ip link set "$veth" master "$BRIDGE" up
    ip netns exec "$ns" ip addr add "$addr/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
}

# ---------------------------------------------------------------- munge
if ! munge_ok; then
    getent passwd munge >/dev/null || die "user 'munge' missing (package munge broken?)"
    if [[ ! -s /etc/munge/munge.key ]]; then
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile=/etc/munge/munge.key --force >"$LOG/mungekey.log" 2>&1 ||
                die "mungekey --create" "$LOG/mungekey.log"
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        fi
    fi
    chown munge:munge /etc/munge /etc/munge/munge.key
    chmod 700 /etc/munge
    chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
    chmod 755 /run/munge
    chmod 700 /var/log/munge
    stop_daemons 5 munged # stale daemon whose socket does not answer
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    launch munged runuser -u munge -- /usr/sbin/munged
    touch "$STATE/run/munged.ours"
    for ((i = 0; i < 50; i++)); do
        munge_ok && break
        sleep 0.1
    done
    munge_ok || die "munged does not answer (munge -n | unmunge)" "/var/log/munge/munged.log"
fi

# ---------------------------------------------------------------- MariaDB
DATADIR="$STATE/mysql"
DB_SOCK="$STATE/run/mysqld.sock"
sql() { mariadb --no-defaults -S "$DB_SOCK" -u root "$@"; }
if ! alive mariadbd; then
    if [[ ! -d $DATADIR/mysql ]]; then
        rm -rf "$DATADIR"
        mkdir -p "$DATADIR"
        mariadb-install-db --no-defaults --user=root --datadir="$DATADIR" \
            --auth-root-authentication-method=socket --skip-test-db \
            >"$LOG/mariadb-install.log" 2>&1 ||
            die "mariadb-install-db (datadir $DATADIR)" "$LOG/mariadb-install.log"
    fi
    rm -f "$DB_SOCK"
    setsid mariadbd --no-defaults --user=root --datadir="$DATADIR" \
        --socket="$DB_SOCK" --port="$DB_PORT" --bind-address=127.0.0.1 \
        --pid-file="$STATE/run/mariadbd.pid" --log-error="$LOG/mariadb.log" \
        --skip-name-resolve --skip-log-bin --performance-schema=OFF \
        --innodb-buffer-pool-size=256M --innodb-log-file-size=64M \
        --innodb-flush-log-at-trx-commit=2 --innodb-lock-wait-timeout=900 \
        --max-allowed-packet=64M 9>&- </dev/null >>"$LOG/mariadb.out" 2>&1 &
    db_pid=$!
    for ((i = 0; i < 300; i++)); do
        kill -0 "$db_pid" 2>/dev/null || break
        [[ -S $DB_SOCK ]] && mariadb-admin --no-defaults -S "$DB_SOCK" -u root ping \
            >/dev/null 2>&1 && break
        sleep 0.1
    done
    alive mariadbd || die "MariaDB did not start (port $DB_PORT taken?)" "$LOG/mariadb.log"
fi
sql >"$LOG/mariadb-setup.log" 2>&1 <<SQL || die "creating slurm_acct_db / user $DB_USER" "$LOG/mariadb-setup.log"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO '$DB_USER'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO '$DB_USER'@'localhost';
FLUSH PRIVILEGES;
SQL

# ---------------------------------------------------------------- slurmdbd
if ((changed_dbd)); then stop_daemons 15 slurmdbd; fi
if ! alive slurmdbd; then
    launch slurmdbd slurmdbd
fi
wait_for slurmdbd 60 sacctmgr -n -P list cluster format=Cluster
sacctmgr -n -P list cluster format=Cluster >"$STATE/run/clusters" 2>"$LOG/sacctmgr.log" ||
    die "slurmdbd does not answer (sacctmgr list cluster)" "$LOG/slurmdbd.log"
if ! grep -qx "$CLUSTER" "$STATE/run/clusters"; then
    sacctmgr -i add cluster "$CLUSTER" >>"$LOG/sacctmgr.log" 2>&1 ||
        die "sacctmgr add cluster $CLUSTER" "$LOG/sacctmgr.log"
fi

# ---------------------------------------------------------------- slurmctld + slurmd
if ((changed_slurm)); then
    # shellcheck disable=SC2046 # one word per daemon name
    stop_daemons 15 slurmd $(node_slurmds) slurmctld
    stop_netns_processes
fi
if ((NODES == 1)); then
    remove_netns # left by an earlier --nodes N (its slurmds were stopped just above)
else
    setup_network
fi
if ! alive slurmctld; then
    launch slurmctld slurmctld
fi
wait_for slurmctld 30 scontrol ping
scontrol ping >/dev/null 2>&1 || die "slurmctld does not answer (scontrol ping)" "$LOG/slurmctld.log"
for d in $(slurmd_names); do
    alive "$d" && continue
    node=${d#slurmd@}
    if [[ $d == slurmd || $node == localhost ]]; then
        if [[ $CGROUP == hide ]]; then
            # slurmd sees a tmpfs with one named cgroup v1 hierarchy (no controllers), as in
            # the CI containers; its jobs inherit that view
            launch "$d" unshare --mount --propagation slave sh -c "mount -t tmpfs grpo-nocg \
                /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd && mount -t cgroup \
                -o none,name=systemd grpo-nocg /sys/fs/cgroup/systemd && exec slurmd -N localhost"
        else
            launch "$d" slurmd -N localhost
        fi
    else
        # Its own network namespace, a mount namespace that only swaps in its /etc/hosts, and
        # a UTS namespace so that `hostname` in a job prints the node's name, as on a real
        # cluster. (Not `ip netns exec`: it remounts /sys without /sys/fs/cgroup, which
        # slurmd needs.)
        mkdir -p "$STATE/spool/slurmd-$node"
        launch "$d" nsenter --net="/run/netns/$node" unshare --mount --uts --propagation slave \
            sh -c "mount --bind /etc/netns/$node/hosts /etc/hosts && hostname $node &&
                exec slurmd -N $node"
    fi
done

# ---------------------------------------------------------------- wait for idle node + sacct
declare -A resumed=()
state=""
node=""
deadline=$((SECONDS + WAIT))
# all_ready: every node idle (resuming a node an earlier run left down/drained, e.g. after a
# killed slurmd, at most 3 times); sets $node/$state to the first one that is not.
all_ready() {
    for node in $(all_nodes); do
        state=$(node_state "$node")
        case "$state" in
        idle | mix | alloc | comp) continue ;;
        down* | drain* | drng* | fail* | inval*)
            if ((${resumed[$node]:-0} < 3)) && [[ $state != *'*' ]]; then
                scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
                resumed[$node]=$((${resumed[$node]:-0} + 1))
            fi
            ;;
        esac
        return 1
    done
    return 0
}
while ((SECONDS < deadline)); do
    for d in $(slurmd_names); do alive "$d" || die "$d exited" "$(log_of "$d")"; done
    alive slurmctld || die "slurmctld exited" "$LOG/slurmctld.log"
    if all_ready && sacct -n -X -o JobID >/dev/null 2>&1; then
        extra=""
        ((NODES == 1)) || extra="; partition multi: $(all_nodes | tail -n +2 | paste -sd, -)"
        gpus="gpu:$NGPU"
        ((REAL_GPUS)) && gpus+=" ($(gpu_devices | paste -sd, -))"
        echo "slurm: cluster up in $((SECONDS - T0))s (node localhost idle," \
            "CPUs=$CPUS RealMemory=$MEM $gpus, partition debug$extra; logs in $LOG)"
        exit 0
    fi
    sleep 0.2
done
reason=$(sinfo -h -N -n "${node:-localhost}" -o %E 2>/dev/null || true)
die "node ${node:-?} not idle after ${WAIT}s (state '${state:-?}', reason '${reason:-?}')" \
    "or sacct fails; see also the slurmd logs and $LOG/slurmdbd.log" "$LOG/slurmctld.log"
