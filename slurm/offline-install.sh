#!/usr/bin/env bash
# Install the test cluster's packages from a folder of Debian 12 .debs (made by
# slurm/offline-debs.sh) on a machine that reaches no package registry, e.g. a lent GPU node
# running Ubuntu. slurm/up.sh runs it when GRPO_SLURM_DEBS names the folder and Slurm is
# missing; it can also run alone:   bash slurm/offline-install.sh DIR
#
# Not `dpkg -i`: the .debs are Debian's, the target may be another distribution (Ubuntu
# 24.04 renamed many libraries, e.g. libaio1 -> libaio1t64), and dpkg would refuse their
# dependencies. Instead, as root:
#  * the programs (the packages listed in DIR/PROGRAMS: Slurm, munge, MariaDB) are unpacked
#    into / with `tar --skip-old-files --keep-directory-symlink`: nothing that exists is
#    overwritten, and /lib -> usr/lib style links stay links;
#  * the libraries (DIR/LIBS) are unpacked into a staging dir, and only the shared objects
#    whose soname the target's dynamic linker does not know (ldconfig -p) are copied to
#    $PREFIX/lib, which /etc/ld.so.conf.d/zz-grpo-slurm.conf lists after the system's dirs:
#    the system's own copy of a library always wins;
#  * the users that the packages' maintainer scripts would have made (munge) are made;
#  * every daemon and client binary is checked with ldd; a missing library fails the install.
# Idempotent: a second run changes nothing.
set -euo pipefail
dir=${1:?usage: offline-install.sh DIR (the folder slurm/offline-debs.sh filled)}
PREFIX=${GRPO_SLURM_PREFIX:-/opt/grpo-slurm}
[[ $EUID -eq 0 ]] || { echo "offline-install: must run as root" >&2; exit 1; }
[[ -s $dir/PROGRAMS && -s $dir/LIBS ]] || {
    echo "offline-install: $dir has no PROGRAMS/LIBS lists (make it with slurm/offline-debs.sh)" >&2
    exit 1
}
deb_of() {
    # the .deb of package $1 in $dir (name_version_arch.deb)
    local f
    for f in "$dir/$1"_*.deb; do
        [[ -e $f ]] && echo "$f" && return 0
    done
    echo "offline-install: no .deb for $1 in $dir" >&2
    return 1
}

# ---- programs into /
while read -r p; do
    [[ -n $p ]] || continue
    dpkg-deb --fsys-tarfile "$(deb_of "$p")" |
        tar -x -C / --skip-old-files --keep-directory-symlink --no-same-owner \
            --exclude='./usr/share/doc*' --exclude='./usr/share/man*' \
            --exclude='./etc/init.d*' --exclude='./lib/systemd*' --exclude='./usr/lib/systemd*'
done <"$dir/PROGRAMS"

# Debian makes these through update-alternatives in the packages' postinst; slurmd runs
# /usr/sbin/slurmstepd (a compiled-in path) for every job step.
for b in slurmctld slurmd slurmstepd; do
    [[ -e /usr/sbin/$b ]] || ln -s "$b-wlm" "/usr/sbin/$b"
done

# ---- libraries: only sonames the target lacks, into $PREFIX/lib
stage=$PREFIX/stage
mkdir -p "$stage" "$PREFIX/lib"
while read -r p; do
    [[ -n $p ]] || continue
    dpkg-deb -x "$(deb_of "$p")" "$stage"
done <"$dir/LIBS"
known=$(ldconfig -p | awk '{ print $1 }' | sort -u)
# The sonames in the staging dir: Debian's runtime library packages ship each soname as a
# symlink (libfoo.so.1 -> libfoo.so.1.2.3), or as the file itself when it has no longer name.
targets=$(find "$stage" -name 'lib*.so.*' -type l -printf '%l\n' | sed 's|.*/||' | sort -u)
added=()
while IFS= read -r f; do
    name=${f##*/}
    if [[ ! -L $f ]] && grep -qxF "$name" <<<"$targets"; then continue; fi # a symlink's target
    grep -qxF "$name" <<<"$known" && continue # the system has this soname: keep its own
    [[ -e $PREFIX/lib/$name ]] || added+=("$name")
    cp -fL "$f" "$PREFIX/lib/$name"
done < <(find "$stage" \( -type f -o -type l \) -name 'lib*.so.*' | sort)
echo "$PREFIX/lib" >/etc/ld.so.conf.d/zz-grpo-slurm.conf
ldconfig
rm -rf "$stage"

# ---- what the maintainer scripts would have done
if ! getent group munge >/dev/null; then groupadd --system munge; fi
if ! getent passwd munge >/dev/null; then
    useradd --system --gid munge --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin munge
fi
# The cluster's daemons meet at "localhost" (slurm.conf); a bare image may lack /etc/hosts.
getent hosts localhost >/dev/null || echo "127.0.0.1 localhost" >>/etc/hosts
mkdir -p /etc/slurm /etc/munge /var/lib/munge /var/log/munge /run/munge
chown munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge

# ---- every binary up.sh starts or calls must find its libraries
bins=(/usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmstepd /usr/sbin/slurmdbd
    /usr/bin/sbatch /usr/bin/srun /usr/bin/squeue /usr/bin/sacct /usr/bin/sinfo
    /usr/bin/scontrol /usr/bin/scancel /usr/bin/sacctmgr /usr/sbin/munged /usr/bin/munge
    /usr/bin/unmunge /usr/sbin/mariadbd /usr/bin/mariadb /usr/bin/mariadb-admin
    /usr/bin/my_print_defaults /usr/bin/mariadb-install-db /bin/ip)
plugins=(auth_munge cred_munge select_cons_tres sched_backfill accounting_storage_slurmdbd
    accounting_storage_mysql jobacct_gather_linux proctrack_linuxproc task_none gres_gpu
    mpi_none jobcomp_none)
bad=0
for b in "${bins[@]}"; do
    [[ -e $b ]] || { echo "offline-install: missing $b" >&2; bad=1; continue; }
    [[ $(head -c 4 "$b") == $'\x7fELF' ]] || continue # mariadb-install-db is a script
    if ldd "$b" 2>&1 | grep -q 'not found'; then
        echo "offline-install: $b: $(ldd "$b" | grep 'not found' | tr -s ' \t' ' ' | paste -sd,)" >&2
        bad=1
    fi
done
plugdir=/usr/lib/x86_64-linux-gnu/slurm-wlm
for p in "${plugins[@]}"; do
    f=$plugdir/$p.so
    [[ -e $f ]] || { echo "offline-install: missing plugin $f" >&2; bad=1; continue; }
    if ldd "$f" 2>&1 | grep 'not found' | grep -qv libslurmfull; then
        echo "offline-install: $f: $(ldd "$f" | grep 'not found' | tr -s ' \t' ' ' | paste -sd,)" >&2
        bad=1
    fi
done
((bad == 0)) || { echo "offline-install: FAILED (see above)" >&2; exit 1; }
echo "offline-install: $(sinfo --version), munge $(munged --version | awk '{ print $1 }')," \
    "MariaDB $(mariadbd --version 2>/dev/null | awk '{ print $3 }') installed from $dir;" \
    "libraries the system lacked, in $PREFIX/lib: ${added[*]:-none}"
