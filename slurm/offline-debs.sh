#!/usr/bin/env bash
# Download, on a Debian 12 machine with package access, the .debs that slurm/up.sh needs to
# bring the test cluster up on a machine that reaches no package registry (a lent GPU node):
#
#   bash slurm/offline-debs.sh DIR        (default DIR: .slurmdebs in the current directory)
#
# then carry DIR to the other machine and there run
#
#   GRPO_SLURM_DEBS=DIR bash slurm/up.sh --real-gpus
#
# (up.sh calls slurm/offline-install.sh DIR when Slurm is not installed there).
# What it fetches: the programs (slurmctld, slurmd, slurm-client, the plugins, slurmdbd and its
# MySQL plugin, munge, MariaDB's server core (mariadbd, mariadb-install-db) and clients (not
# mariadb-server: its Aria/MyISAM tools and mariadbd-safe are not used), netbase
# (/etc/protocols and /etc/services: without them getaddrinfo fails in slurmdbd and
# slurmctld on a bare image, "Unable to resolve (null)"), iproute2 (up.sh's `ip`) and the shared
# libraries they need,
# computed as the lib* closure of the programs' Depends (apt-cache depends --recurse, lib*
# packages only; libc6, libgcc-s1 and libstdc++6 are left out: every target has newer ones).
# offline-install.sh later installs a library only where the target lacks its soname.
# slurmdbd + MariaDB are included because grpo-monitor, grpo-status and submitit read job
# states with sacct, which needs accounting (without it the monitor cannot act and
# grpo-status shows the Slurm state as '?').
set -euo pipefail
dir=${1:-.slurmdebs}
PROGRAMS=(slurmctld slurmd slurm-client slurm-wlm-basic-plugins slurmdbd slurm-wlm-mysql-plugin
    munge libmunge2 mariadb-server-core mariadb-client mariadb-client-core libmariadb3
    mariadb-common netbase iproute2)
SKIP_LIBS=" libc6 libgcc-s1 libstdc++6 "

deps_of() {
    # direct Depends/PreDepends of package $1 (virtual packages and alternatives resolved
    # by apt-cache to the first real candidate)
    apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
        --no-replaces --no-enhances "$1" 2>/dev/null |
        awk '/^ *\|?(Pre)?Depends:/ { print $2 }' | tr -d '<>' | sort -u
}

# the lib* closure: start from the programs' direct dependencies, follow lib* packages only
declare -A seen=()
queue=()
for p in "${PROGRAMS[@]}"; do seen[$p]=1; done
for p in "${PROGRAMS[@]}"; do
    for d in $(deps_of "$p"); do queue+=("$d"); done
done
libs=()
while ((${#queue[@]})); do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    [[ -n ${seen[$p]:-} ]] && continue
    seen[$p]=1
    [[ $p == lib* && $p != *-perl && $SKIP_LIBS != *" $p "* ]] || continue
    apt-cache show "$p" >/dev/null 2>&1 || continue # a virtual package
    libs+=("$p")
    for d in $(deps_of "$p"); do queue+=("$d"); done
done

mkdir -p "$dir"
rm -f "$dir"/*.deb
(cd "$dir" && apt-get download "${PROGRAMS[@]}" "${libs[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
ls "$dir"/*.deb >/dev/null
printf '%s\n' "${PROGRAMS[@]}" >"$dir/PROGRAMS"
printf '%s\n' "${libs[@]}" >"$dir/LIBS"
echo "offline-debs: $(find "$dir" -name '*.deb' | wc -l) packages," \
    "$(du -sb "$dir" | awk '{ printf "%.1f MB", $1 / 1e6 }') in $dir" \
    "(programs: ${#PROGRAMS[@]}; libraries: ${libs[*]})"
